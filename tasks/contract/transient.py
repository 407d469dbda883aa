"""The one definition of a transient infrastructure error: the database or the broker is down.

Workers retry such an error with backoff (tasks/failures.py); the API answers it with 503 and
Retry-After (app/errors.py). Anything else is the request's or the code's fault.
"""

from __future__ import annotations

import kombu.exceptions
import sqlalchemy.exc

try:  # redis-py errors that kombu lets through unwrapped
    import redis.exceptions as _redis

    _REDIS_DOWN: tuple[type[Exception], ...] = (_redis.ConnectionError, _redis.TimeoutError)
except ImportError:  # pragma: no cover - an AMQP-only install
    _REDIS_DOWN = ()

TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,  # the connection went away under the driver
    sqlalchemy.exc.TimeoutError,  # pool exhausted
    sqlalchemy.exc.DisconnectionError,
    kombu.exceptions.OperationalError,
    ConnectionError,
    TimeoutError,
    *_REDIS_DOWN,
)

# kombu's Redis batch publish (5.7, pinned) raises this with what broke its pipeline (a reset
# connection, mostly) as the cause; the celery-types stubs do not know the class yet.
_BATCH_PUBLISH_ERROR: type[Exception] = kombu.exceptions.BatchPublishError  # type: ignore[attr-defined]


def is_transient(exc: BaseException) -> bool:
    """True for an outage worth retrying: one of TRANSIENT_ERRORS, a batch publish that one of
    them broke, or any driver error that invalidated its connection (SQLAlchemy marks those
    whatever their class)."""
    if isinstance(exc, TRANSIENT_ERRORS):
        return True
    if isinstance(exc, _BATCH_PUBLISH_ERROR):  # the cause tells whether it was an outage
        return exc.__cause__ is not None and is_transient(exc.__cause__)
    return isinstance(exc, sqlalchemy.exc.DBAPIError) and bool(exc.connection_invalidated)
