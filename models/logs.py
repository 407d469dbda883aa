"""The one log setup of every process (gunicorn, workers, beat, the CLI): JSON or text lines,
each with the request and job it belongs to, secrets masked.

The context (request_id, job_id, tenant, stage, task_id) lives in a context variable: a thread
(the Celery threads pool, Flask's development server) and a greenlet (gunicorn's gevent worker:
greenlet gives each greenlet its own context) each see only their own. Whoever starts a unit of
work calls `clear` first: a request (app.request_id, app.server), a task (tasks.log_context).

Only the standard library, python-json-logger and models.redaction are imported here: gunicorn's
arbiter loads this module before it forks and before gevent patches the worker.
"""

from __future__ import annotations

import logging
import logging.config
import re
import uuid
from collections.abc import Mapping
from contextvars import ContextVar
from datetime import date, datetime
from typing import Any, Literal

from pythonjsonlogger.json import JsonFormatter

from models import redaction

FIELDS = ("request_id", "job_id", "tenant", "stage", "task_id")
REQUEST_ID_HEADER = "X-Request-Id"
# What a proxy or client typically sends (a UUID, a hex or base64url trace id); anything else,
# longer, or with characters a log reader could trip on, is replaced.
_VALID_REQUEST_ID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")
LogFormat = Literal["json", "text"]

_EMPTY: Mapping[str, str] = {}
# Never mutated: `bind` sets a new dict, so a copied context (a thread started from this one)
# cannot change this one's fields.
_context: ContextVar[Mapping[str, str]] = ContextVar("genqueue_log_context", default=_EMPTY)


def bind(**fields: object) -> None:
    """Add fields to this thread's (or greenlet's) log context; None removes one."""
    unknown = set(fields) - set(FIELDS)
    if unknown:
        raise ValueError(f"not a log context field: {sorted(unknown)}")
    merged = dict(_context.get())
    for key, value in fields.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = str(value)
    _context.set(merged)


def clear(**fields: object) -> None:
    """Start a new unit of work (a request, a task): drop every field, then bind `fields`."""
    _context.set(_EMPTY)
    bind(**fields)


def request_id(sent: str | None) -> str:
    """The client's X-Request-Id if well formed, else a new one (32 hex digits)."""
    if sent is not None and _VALID_REQUEST_ID.fullmatch(sent):
        return sent
    return uuid.uuid4().hex


def current() -> dict[str, str]:
    return dict(_context.get())


class ContextFilter(logging.Filter):
    """Puts the context's fields on each record (an `extra=` of the same name wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for key, value in _context.get().items():
            if key not in record.__dict__:
                setattr(record, key, value)
        return True


def _masked(value: Any) -> Any:
    """Every string in a log line's data masked (models.redaction), at any depth; other objects
    are rendered with str() first, so an object whose repr carries a secret is masked too."""
    if isinstance(value, str):
        return redaction.redact(value)
    if value is None or isinstance(value, (bool, int, float, datetime, date)):
        return value
    if isinstance(value, Mapping):
        return {str(k): _masked(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [_masked(v) for v in value]
    return redaction.redact(str(value))


class JsonLines(JsonFormatter):
    """One JSON object per line: time, level, logger, message, the context, extras, exc_info."""

    def __init__(self) -> None:
        super().__init__(
            ["levelname", "name", "message"],
            rename_fields={"levelname": "level", "name": "logger"},
            timestamp="time",
        )

    def process_log_record(self, log_data: dict[str, Any]) -> dict[str, Any]:
        # The record factory (models.redaction.install) masked the message and the traceback
        # text, but not `extra=` fields nor a traceback formatted here from exc_info.
        masked: dict[str, Any] = _masked(log_data)
        return {"time": masked.pop("time", None), **masked}  # time first, as a reader scans


class TextLines(logging.Formatter):
    """`time LEVEL logger [job_id=... stage=...]: message`, for a terminal."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s%(context)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        fields = " ".join(f"{k}={record.__dict__[k]}" for k in FIELDS if record.__dict__.get(k))
        record.context = f" [{fields}]" if fields else ""
        return redaction.redact(super().format(record))


def logging_config(fmt: LogFormat, level: str | int) -> dict[str, Any]:
    """The dictConfig of every process: one handler on stderr; gunicorn's and Celery's loggers
    propagate to it instead of keeping handlers of their own."""
    formatter = JsonLines if fmt == "json" else TextLines
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "filters": {"context": {"()": ContextFilter}},
        "formatters": {"lines": {"()": formatter}},
        "handlers": {
            "stderr": {
                "class": "logging.StreamHandler",
                "stream": "ext://sys.stderr",
                "formatter": "lines",
                "filters": ["context"],
            }
        },
        "root": {"level": level, "handlers": ["stderr"]},
        "loggers": {
            name: {"level": lvl, "handlers": [], "propagate": True}
            for name, lvl in (
                ("gunicorn.error", level),
                ("gunicorn.access", "INFO"),  # on only when GUNICORN_ACCESS_LOG is set
                ("celery", level),
                ("celery.task", level),
                ("celery.redirected", level),
            )
        },
    }


def configure(fmt: LogFormat, level: str | int) -> None:
    """Configure this process's logging (replacing handlers set before) and mask secrets."""
    redaction.install()
    logging.config.dictConfig(logging_config(fmt, level))
