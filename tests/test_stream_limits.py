"""Event stream bounds on the production server (gunicorn, gevent): real concurrent streams, real sockets."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.support.api import make_api_key
from tests.support.procs import gunicorn_web, wait_for

SSE = {"Accept": "text/event-stream"}


@dataclass
class Attempt:
    """One client's try at a stream; an admitted one is held open until `release` is set."""

    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    problem: dict[str, Any] | None = None
    first: bytes = b""
    opened: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)


def _hold(base: str, key: str, job_id: str, attempt: Attempt, go: threading.Barrier | None = None) -> None:
    headers = SSE | {"Authorization": f"Bearer {key}"}
    try:
        with httpx.Client(base_url=base, timeout=30) as http:
            if go is not None:
                go.wait(30)  # every client asks at once
            with http.stream("GET", f"/v1/jobs/{job_id}/events", headers=headers) as resp:
                attempt.status, attempt.headers = resp.status_code, dict(resp.headers)
                if resp.status_code != 200:
                    resp.read()
                    attempt.problem = resp.json()
                    return
                # Kept referenced while held: a dropped iterator closes the connection (httpcore).
                body = resp.iter_bytes()
                attempt.first = next(body)  # the stream is live: `retry:` came
                attempt.opened.set()
                attempt.release.wait(60)
                body.close()
    finally:
        attempt.opened.set()  # answered, refused, or failed (status 0)


def _start(base: str, key: str, job_id: str, go: threading.Barrier | None = None) -> Attempt:
    attempt = Attempt()
    threading.Thread(target=_hold, args=(base, key, job_id, attempt, go), daemon=True).start()
    return attempt


def _open(base: str, key: str, job_id: str) -> Attempt:
    attempt = _start(base, key, job_id)
    assert attempt.opened.wait(30), "no answer to the stream request"
    return attempt


def _refused(attempt: Attempt, status: int) -> None:
    assert attempt.status == status, (attempt.status, attempt.problem)
    assert attempt.headers["content-type"] == "application/problem+json"
    assert int(attempt.headers["retry-after"]) >= 1
    assert attempt.problem is not None and attempt.problem["status"] == status


def _job(base: str, key: str) -> str:
    resp = httpx.post(
        f"{base}/v1/jobs",
        json={"prompt": "a stream of herons", "modality": "text"},
        headers={"Authorization": f"Bearer {key}"},
        timeout=30,
    )
    assert resp.status_code == 202, resp.text
    return str(resp.json()["id"])  # no worker: it stays queued, its streams stay open


@pytest.mark.slow
def test_concurrent_streams_past_the_tenant_and_process_bounds(settings, sessions, broker, tmp_path: Path):
    keys = {name: make_api_key(sessions, name) for name in ("streams-a", "streams-b", "streams-c")}
    env = {
        "GENQUEUE_STREAM_MAX_PER_PROCESS": 3,
        "GENQUEUE_STREAM_MAX_PER_TENANT": 2,
        "GENQUEUE_STREAM_HEARTBEAT_S": 0.2,  # writes often, so a client that left is noticed soon
    }
    with gunicorn_web(settings, tmp_path / "gunicorn.log", **env) as base:
        jobs = {name: _job(base, key) for name, key in keys.items()}
        # Six of one tenant's clients at the same moment: two get a stream, four a 429.
        go = threading.Barrier(6)
        burst = [_start(base, keys["streams-a"], jobs["streams-a"], go) for _ in range(6)]
        assert all(a.opened.wait(30) for a in burst)
        admitted = [a for a in burst if a.status == 200]
        assert len(admitted) == 2, [a.status for a in burst]
        assert all(a.first.startswith(b"retry:") for a in admitted)
        for a in burst:
            if a.status != 200:
                _refused(a, 429)
                assert a.problem is not None and a.problem["type"].endswith(":rate-limited")

        b = _open(base, keys["streams-b"], jobs["streams-b"])  # the third stream of the process
        assert b.status == 200
        _refused(_open(base, keys["streams-c"], jobs["streams-c"]), 503)  # the process is full

        admitted[0].release.set()  # a client goes: its slot frees once the server notices

        def admitted_now() -> Attempt | None:
            attempt = _open(base, keys["streams-c"], jobs["streams-c"])
            return attempt if attempt.status == 200 else None

        c = wait_for(admitted_now, 30, 0.2, "a freed stream slot")
        _refused(_open(base, keys["streams-c"], jobs["streams-c"]), 503)  # full again
        for attempt in (admitted[1], b, c):
            attempt.release.set()
        again = wait_for(admitted_now, 30, 0.2, "every slot freed")
        again.release.set()
