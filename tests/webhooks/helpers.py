"""Webhook test helpers: a recording receiver on pytest-httpserver, API shortcuts, test settings."""

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
from tests.support.procs import wait_for

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
        try:
            wait_for(lambda: check(self), timeout, 0.05, "the receiver's condition")
        except AssertionError as exc:
            raise AssertionError(f"receiver: {exc}; got {self.summary()}") from None

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


def submit(
    client,
    receiver: Receiver | None = None,
    events: list[str] | None = None,
    url: str | None = None,
    **body: Any,
) -> str:
    """POST a job (text unless told otherwise) with a webhook to `receiver` (or `url`); its id."""
    payload: dict[str, Any] = {"prompt": "a fox", "modality": "text", **body}
    if receiver is not None or url is not None:
        target = url or receiver.url  # type: ignore[union-attr]
        payload["webhook"] = {"url": target} | ({"events": events} if events else {})
    resp = client.post("/v1/jobs", json=payload)
    assert resp.status_code == 202, resp.get_json()
    return resp.get_json()["id"]


def deliveries(client, job_id: str) -> list[dict[str, Any]]:
    resp = client.get(f"/v1/jobs/{job_id}/webhook-deliveries")
    assert resp.status_code == 200
    return resp.get_json()["data"]


def secret(client) -> str:
    return client.get("/v1/webhooks/secret").get_json()["secret"]
