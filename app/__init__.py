"""The Flask API front: validates jobs, records them in the database and publishes them to Celery.

`create_app` lives in app.factory and is loaded on first use, so that importing a light module
of this package (app.server, the gunicorn worker class that the arbiter loads before it forks
and before gevent patches the standard library) does not import Flask, SQLAlchemy, psycopg or
Celery in the arbiter. What the handlers share is in app.services.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checker sees the real name; at run time __getattr__ loads it
    from app.factory import create_app

__all__ = ["create_app"]


def __getattr__(name: str) -> Any:
    if name == "create_app":
        from app import factory

        return factory.create_app
    raise AttributeError(f"module 'app' has no attribute {name!r}")
