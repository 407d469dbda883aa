"""The web tier's gunicorn worker: a greenlet per connection, read deadlines, problem+json errors.

gthread gives each connection a thread while it waits for a request, so a few hundred idle or
trickling connections starve everyone (gunicorn has no header-read timeout). Here:
- a connection costs a greenlet, not a thread; `worker_connections` caps them per process;
- the request line and headers must arrive within `keepalive` seconds (gevent's timeout_ctx
  covers the first request too, not only the idle time between requests), or the connection
  is closed;
- the body must arrive within `GENQUEUE_WEB_BODY_TIMEOUT_S` (it is read here, before the app
  runs, so a trickling upload never holds a database connection), or the client gets 408;
- gunicorn's own protocol errors (414, 431, 400 on a bad request line) are problem+json like
  every other error, without echoing what the client sent.

Each request starts with an empty log context: a connection's greenlet serves its keep-alive
requests one after another, and nothing of one may be logged as part of the next.

Only gunicorn, gevent and models.logs are imported at module level: the arbiter imports this
class before it forks, and the application must be imported only after gevent has patched the
worker.
"""

from __future__ import annotations

import gc
import io
import json
import re
import socket
from typing import Any

import gevent
from gunicorn import glogging, util
from gunicorn.workers.ggevent import GeventWorker

from models import logs  # the standard library and python-json-logger only (models.logs)

BATCH_PATH = "/v1/jobs/batch"  # app.batch's route: the one body that may be max_batch_body_bytes
_STATUS_LINE = re.compile(rb"^HTTP/1\.[01] (\d{3}) ([^\r\n]*)")


def problem_bytes(
    status: int, title: str, content_type: str = "application/problem+json", request_id: str = ""
) -> bytes:
    """A whole HTTP/1.1 answer carrying an RFC 9457 document; the connection closes after it."""
    body = json.dumps({"type": "about:blank", "title": title, "status": status, "detail": title}).encode()
    rid = f"{logs.REQUEST_ID_HEADER}: {request_id}\r\n" if request_id else ""
    head = (
        f"HTTP/1.1 {status} {title}\r\nConnection: close\r\nContent-Type: {content_type}\r\n"
        f"{rid}Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode("latin-1") + body


class _Capture:
    """Stands in for the client socket while gunicorn writes its HTML error page."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.data = b""

    def sendall(self, data: bytes) -> None:
        self.data += data

    def send(self, data: bytes) -> int:
        self.data += data
        return len(data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)


def _linger(sock: Any, seconds: float = 1.0) -> None:
    """Half-close, then discard what the client still sends for a moment before the close.

    Closing a socket with unread input makes the kernel send RST, which can destroy the answer
    just written before the client reads it (a trickling client is always mid-send).
    """
    timer = gevent.Timeout(seconds)
    timer.start()
    try:
        sock.shutdown(socket.SHUT_WR)
        while sock.recv(65536):
            pass
    except OSError:
        pass
    except gevent.Timeout as exc:
        if exc is not timer:
            raise
    finally:
        timer.close()


def _request_id(req: Any) -> str:
    """The request's X-Request-Id as the app would take it; a new one when the request (or its
    headers) could not be read."""
    headers = getattr(req, "headers", None) or []
    sent = next((v for k, v in headers if k.upper() == logs.REQUEST_ID_HEADER.upper()), None)
    return logs.request_id(sent)


class HardenedGeventWorker(GeventWorker):
    """gunicorn's gevent worker with a body deadline and problem+json protocol errors."""

    body_timeout_s = 10.0
    max_body_bytes = 64 * 1024
    max_batch_body_bytes = 4 * 1024 * 1024  # POST /v1/jobs/batch (BATCH_PATH) only

    def load_wsgi(self) -> None:
        # Runs after gevent has patched this process (GeventWorker.init_process), like the app.
        super().load_wsgi()
        # Everything loaded so far (the app, its libraries) lives as long as the process: out of
        # the collector's sight, a full collection no longer walks it. Those walks were a fifth of
        # a 500-job batch's CPU (62 of 317 us per job, measured in process), and a cost per
        # request that grew with whatever the process had loaded.
        gc.freeze()
        from models.settings import Settings

        settings = Settings()
        self.body_timeout_s = settings.web_body_timeout_s
        self.max_body_bytes = settings.max_body_bytes
        self.max_batch_body_bytes = settings.max_batch_body_bytes

    def handle_request(self, listener_name: Any, req: Any, sock: Any, addr: Any) -> Any:
        logs.clear()  # the app binds this request's id (app.request_id); the access log reads it
        self._buffer_body(req, sock)
        return super().handle_request(listener_name, req, sock, addr)

    def _buffer_body(self, req: Any, sock: Any) -> None:
        """Read the whole body (up to one byte over the limit) within the deadline, or answer 408."""
        limit = self.max_batch_body_bytes if req.path == BATCH_PATH else self.max_body_bytes
        timer = gevent.Timeout(self.body_timeout_s)
        timer.start()
        try:
            data = req.body.read(limit + 1)
        except gevent.Timeout as exc:
            if exc is not timer:
                raise
            rid = _request_id(req)
            logs.bind(request_id=rid)
            self.log.info("request body not received within %.0f s: 408", self.body_timeout_s)
            util.write_nonblock(sock, problem_bytes(408, "Request Timeout", request_id=rid))
            _linger(sock)
            raise StopIteration() from None  # base_async.handle closes the connection
        finally:
            timer.close()
        req.body = io.BytesIO(data)
        if len(data) > limit:
            req.must_close = True  # the rest is still unread on the socket: the app answers 413

    def handle_error(self, req: Any, client: Any, addr: Any, exc: BaseException) -> None:
        rid = _request_id(req)
        logs.clear(request_id=rid)  # gunicorn's line about the error, and the answer, carry it
        capture = _Capture(client)
        super().handle_error(req, capture, addr, exc)  # type: ignore[arg-type]  # a stand-in socket
        match = _STATUS_LINE.match(capture.data)
        if match is None:  # nothing written (or not HTTP): pass it on unchanged
            if capture.data:
                util.write_nonblock(client, capture.data)
            return
        # The title only: gunicorn's message can quote the request line or a header.
        status, title = int(match.group(1)), match.group(2).decode("latin-1")
        try:
            util.write_nonblock(client, problem_bytes(status, title, request_id=rid))
        except Exception:
            self.log.debug("Failed to send error message.")


class Logger(glogging.Logger):
    """gunicorn's logger under ops/gunicorn.conf.py's `logconfig_dict` (models.logs), with the access
    log still off unless `accesslog` is set: gunicorn turns it on for any logconfig_dict, and it
    costs throughput."""

    def _compute_access_log_enabled(self) -> bool:
        return bool(self.cfg.accesslog)
