"""Submit and read do the same small, fixed amount of database work whatever the backlog."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import event, func, insert, select

from app.published import PublishedMarks
from models import Job, states
from models.base import utcnow


@contextmanager
def statements(app) -> Iterator[list[str]]:
    """The SQL this thread runs (the published_at recorder's batches run in its own thread)."""
    seen: list[str] = []
    engine = app.extensions["genqueue"].engine
    me = threading.get_ident()

    def record(_conn, _cursor, statement, *_args) -> None:
        if threading.get_ident() == me:
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
    # Each request first looks its API key up (one indexed select; cached for a few seconds
    # outside the tests). published_at is written later, in batches (test below).
    assert len(post_full) == len(post_empty) <= 2  # the key, the insert
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


def test_published_marks_are_written_in_one_batched_update(app, client, sessions) -> None:
    marks = PublishedMarks(app.extensions["genqueue"].sessions, interval_s=3600)  # flushed by hand
    _backlog(sessions, 5, "normal")
    with sessions() as s:
        ids = list(s.scalars(select(Job.id)))
    with sessions.begin() as s:  # one job already started: it must not be marked
        states.start_text(s, ids[0])
    for jid in ids:
        marks.add(jid)
    with statements(app) as seen:
        assert marks.flush() == 4
    assert len(seen) == 1 and seen[0].lstrip().upper().startswith("UPDATE")
    with sessions() as s:
        marked = dict(s.execute(select(Job.id, Job.published_at)).all())
    assert marked[ids[0]] is None and all(marked[j] is not None for j in ids[1:])
    assert marks.flush() == 0  # nothing pending: no statement at all


def test_submits_get_published_at_from_the_background_recorder(client, sessions) -> None:
    ids = [client.post("/v1/jobs", json={"prompt": f"fox {i}", "modality": "text"}).get_json()["id"]
           for i in range(5)]  # fmt: skip
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with sessions() as s:
            missing = s.scalar(select(func.count()).where(Job.published_at.is_(None)))
        if missing == 0:
            break
        time.sleep(0.02)
    assert missing == 0, f"{missing} of {len(ids)} jobs have no published_at"
