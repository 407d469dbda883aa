"""The Flask API front: validates jobs, records them in the database and publishes them to Celery.

`create_app`, `Services` and `services` live in app.factory and are loaded on first use, so that
importing a light module of this package (app.server, the gunicorn worker class that the
arbiter loads before it forks and before gevent patches the standard library) does not import
Flask, SQLAlchemy, psycopg or Celery in the arbiter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checker sees the real names; at run time __getattr__ loads them
    from app.factory import Services, create_app, services

__all__ = ["Services", "create_app", "services"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from app import factory

        return getattr(factory, name)
    raise AttributeError(f"module 'app' has no attribute {name!r}")
