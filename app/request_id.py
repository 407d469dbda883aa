"""X-Request-Id: taken from the client when well formed (else made here), logged with every line
of the request, and sent back on every answer, problem+json errors included (models.logs holds
the rule; app.server applies it to gunicorn's own answers)."""

from __future__ import annotations

from flask import Flask, Response, g, request

from models import logs

HEADER = logs.REQUEST_ID_HEADER


def _start() -> None:
    # A new unit of work: nothing of a previous request on this thread or greenlet stays bound.
    g.request_id = logs.request_id(request.headers.get(HEADER))
    logs.clear(request_id=g.request_id)


def _echo(resp: Response) -> Response:
    resp.headers[HEADER] = g.get("request_id") or logs.request_id(request.headers.get(HEADER))
    return resp


def init_app(app: Flask) -> None:
    """Register before every other hook, so a 401 or 429 raised by one is logged and answered
    with the id too."""
    app.before_request_funcs.setdefault(None, []).insert(0, _start)
    app.after_request(_echo)
