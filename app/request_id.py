"""X-Request-Id: taken from the client when well formed (else made here), logged with every line
of the request, and sent back on every answer, problem+json errors included."""

from __future__ import annotations

import re
import uuid

from flask import Flask, Response, g, request

from models import logs

HEADER = "X-Request-Id"
# What a proxy or client typically sends (a UUID, a hex or base64url trace id); anything else,
# longer, or with characters a log reader could trip on, is replaced.
VALID = re.compile(r"[A-Za-z0-9._:@/+=-]{1,128}")


def from_client(value: str | None) -> str:
    """The client's id if well formed, else a new one (32 hex digits)."""
    if value is not None and VALID.fullmatch(value):
        return value
    return uuid.uuid4().hex


def _start() -> None:
    # A new unit of work: nothing of a previous request on this thread or greenlet stays bound.
    g.request_id = from_client(request.headers.get(HEADER))
    logs.clear(request_id=g.request_id)


def _echo(resp: Response) -> Response:
    resp.headers[HEADER] = g.get("request_id") or from_client(request.headers.get(HEADER))
    return resp


def init_app(app: Flask) -> None:
    """Register before every other hook, so a 401 or 429 raised by one is logged and answered
    with the id too."""
    app.before_request_funcs.setdefault(None, []).insert(0, _start)
    app.after_request(_echo)
