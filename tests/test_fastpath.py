"""Submit and read do the same small, fixed amount of database work whatever the backlog."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event, insert

from models import Job
from models.base import utcnow


@contextmanager
def statements(app) -> Iterator[list[str]]:
    seen: list[str] = []
    engine = app.extensions["genqueue"].engine

    def record(_conn, _cursor, statement, *_args) -> None:
        seen.append(statement)

    event.listen(engine, "before_cursor_execute", record)
    try:
        yield seen
    finally:
        event.remove(engine, "before_cursor_execute", record)


def _backlog(sessions, n: int, priority: str) -> None:
    now = utcnow()
    rows = [
        {"id": uuid.uuid4(), "status": "queued", "modality": "text", "prompt": "p", "params": {},
         "priority": priority, "progress": 0, "metadata": {}, "attempts": 0, "created_at": now,
         "updated_at": now}
        for _ in range(n)
    ]  # fmt: skip
    with sessions.begin() as s:
        s.execute(insert(Job), rows)


def _costs(app, client) -> tuple[list[str], list[str]]:
    with statements(app) as post:
        job = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "text"}).get_json()
    with statements(app) as get:
        assert client.get(f"/v1/jobs/{job['id']}").status_code == 200
    return post, get


def test_submit_and_get_cost_does_not_grow_with_the_backlog(app, client, sessions) -> None:
    client.get("/v1/health")
    _costs(app, client)  # warm: the queue totals are fresh for the next second
    post_empty, get_empty = _costs(app, client)
    _backlog(sessions, 500, "normal")
    app.extensions["genqueue.queue"].ttl_s = 3600  # same cache state for both measurements
    post_full, get_full = _costs(app, client)
    # Each request first looks its API key up (one indexed select).
    assert len(post_full) == len(post_empty) <= 3  # the key, insert, mark published
    assert len(get_full) == len(get_empty) <= 3  # the key, the row, its same-priority place
    assert not any("row_number" in s.lower() for s in post_full + get_full)


def test_queue_position_of_a_high_job_behind_a_low_backlog(client, sessions) -> None:
    _backlog(sessions, 200, "low")
    high = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "text", "priority": "high"})
    assert high.get_json()["queue_position"] == 1
    low = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "text", "priority": "low"}).get_json()
    assert client.get(f"/v1/jobs/{low['id']}").get_json()["queue_position"] == 202


def test_get_answers_if_none_match_with_304(client) -> None:
    job = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "text"}).get_json()
    etag = client.get(f"/v1/jobs/{job['id']}").headers["ETag"]
    resp = client.get(f"/v1/jobs/{job['id']}", headers={"If-None-Match": etag})
    assert resp.status_code == 304 and resp.data == b""
