"""Test helpers for webhooks: a recording receiver on pytest-httpserver and the fixtures around it."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from standardwebhooks import Webhook
from werkzeug import Request, Response

from models.settings import Settings

Reply = Callable[[int, dict[str, Any]], Response]  # (call number from 1, payload) -> response


@dataclass
class Call:
    at: float
    headers: dict[str, str]
    body: bytes
    status: int

    @property
    def payload(self) -> dict[str, Any]:
        return json.loads(self.body)


@dataclass
class Receiver:
    """Records every POST it gets and answers with `reply` (200 unless told otherwise)."""

    url: str
    reply: Reply = field(default=lambda n, p: Response(status=200))
    calls: list[Call] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def handle(self, request: Request) -> Response:
        body = request.get_data()
        with self._lock:
            number = len(self.calls) + 1
            resp = self.reply(number, json.loads(body))
            self.calls.append(Call(time.monotonic(), dict(request.headers), body, resp.status_code))
        return resp

    def delivered(self) -> list[Call]:
        return [c for c in self.calls if 200 <= c.status < 300]

    def wait_for(self, check: Callable[[Receiver], bool], timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if check(self):
                return
            time.sleep(0.05)
        raise AssertionError(f"receiver: condition not met in {timeout} s; got {self.summary()}")

    def summary(self) -> list[tuple[str, int]]:
        return [(c.payload["type"], c.status) for c in self.calls]

    def verify(self, secret: str, call: Call) -> dict[str, Any]:
        """What a receiver does: the standardwebhooks package checks id, timestamp and signature."""
        return Webhook(secret).verify(call.body, call.headers)  # type: ignore[no-any-return]


@contextmanager
def serve(httpserver: Any, path: str = "/hook") -> Iterator[Receiver]:
    """A Receiver answering POSTs to `path` on pytest-httpserver's server."""
    rec = Receiver(url=httpserver.url_for(path))
    httpserver.expect_request(path, method="POST").respond_with_handler(rec.handle)
    try:
        yield rec
    finally:
        httpserver.clear()


def hook_settings(settings: Settings, **overrides: Any) -> Settings:
    """The test run's settings with a compressed retry schedule and local receivers allowed."""
    values: dict[str, Any] = {
        "webhook_allow_private": True,
        "webhook_retry_schedule_s": [0.1, 0.1, 0.1, 0.1, 0.1],
        "webhook_progress_interval_s": 0.3,
        "webhook_relay_grace_s": 0.5,
        "webhook_timeout_s": 2.0,
    }
    return settings.model_copy(update=values | overrides)
