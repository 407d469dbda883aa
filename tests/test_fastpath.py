"""Submit and read do the same small, fixed amount of database work whatever the backlog."""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import func, insert, select

from app.admission import EXTENSION as ADMISSION
from app.published import PublishedMarks
from models import Job, states
from models.base import utcnow
from tests.support import plans
from tests.support.procs import wait_for


def statements(app):
    """The SQL this thread runs on the app's engine (the published_at recorder's batches run in
    its own thread)."""
    return plans.statements(app.extensions["genqueue"].engine)


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


Costs = dict[str, list[tuple[str, Any]]]


def _costs(app, client, totals: str) -> Costs:
    """The statements of one submit and one read, with the per-process counts (queue totals,
    admission backlog) either `due` (each request re-counts them, as the first request after
    each TTL does) or `fresh` (reused): set here, so no wall-clock window decides which."""
    ttl = 0 if totals == "due" else 3600
    app.extensions["genqueue.queue"].ttl_s = ttl
    gate = app.extensions[ADMISSION]
    gate.settings = gate.settings.model_copy(update={"admission_cache_s": ttl})
    with statements(app) as post:
        job = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "text"}).get_json()
    with statements(app) as get:
        assert client.get(f"/v1/jobs/{job['id']}").status_code == 200
    return {"post": post, "get": get}


def test_submit_and_get_cost_does_not_grow_with_the_backlog(app, client, sessions, engine) -> None:
    client.post("/v1/jobs", json={"prompt": "warm", "modality": "text"})  # first-use setup
    empty = {t: _costs(app, client, t) for t in ("due", "fresh")}
    _backlog(sessions, 2000, "normal")
    with engine.begin() as conn:
        conn.exec_driver_sql("ANALYZE jobs")  # plans as for a real backlog, not an empty table
    full = {t: _costs(app, client, t) for t in ("due", "fresh")}
    counts = {t: {r: len(full[t][r]) for r in ("post", "get")} for t in full}
    assert counts == {t: {r: len(empty[t][r]) for r in ("post", "get")} for t in empty}
    # Each request first looks its API key up (cached for a few seconds outside the tests).
    # published_at is written later, in batches (test below). Submit: the key, the insert;
    # read: the key, the row (its queue position comes from its enqueue number, app.queue). When
    # due (once per TTL per process), a submit re-measures the admission backlog and both re-read
    # the queue lanes' statistics: those read the whole backlog through an index, which is why
    # they are cached.
    assert counts == {"fresh": {"post": 2, "get": 2}, "due": {"post": 4, "get": 3}}, counts
    for totals in full.values():
        for statement, parameters in totals["post"] + totals["get"]:
            assert "row_number" not in statement.lower()
            assert plans.unindexed(plans.scans(engine, statement, parameters)) == [], statement


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
    assert len(seen) == 1 and seen[0][0].lstrip().upper().startswith("UPDATE")
    with sessions() as s:
        marked = dict(s.execute(select(Job.id, Job.published_at)).all())
    assert marked[ids[0]] is None and all(marked[j] is not None for j in ids[1:])
    assert marks.flush() == 0  # nothing pending: no statement at all


def test_submits_get_published_at_from_the_background_recorder(client, sessions) -> None:
    ids = [client.post("/v1/jobs", json={"prompt": f"fox {i}", "modality": "text"}).get_json()["id"]
           for i in range(5)]  # fmt: skip

    def all_published() -> bool:
        with sessions() as s:
            return s.scalar(select(func.count()).where(Job.published_at.is_(None))) == 0

    wait_for(all_published, 5, 0.02, f"all {len(ids)} jobs to get published_at")


def test_a_read_through_the_driver_answers_as_sqlalchemy_would(app, client, sessions, monkeypatch) -> None:
    """GET /v1/jobs/{id} reads its row through psycopg directly (models.driver_sql): the answer must
    be the one the SQLAlchemy read gives, for a queued job and a finished one with every kind of
    column set (timestamps, floats, JSON, text)."""
    import psycopg

    driver_reads = []
    original = psycopg.Connection.execute

    def counted(self, query, *args, **kwargs):
        if "FROM jobs" in str(query):
            driver_reads.append(query)
        return original(self, query, *args, **kwargs)

    monkeypatch.setattr(psycopg.Connection, "execute", counted)
    meta = {"k": "x", "n": "1"}
    queued = client.post("/v1/jobs", json={"prompt": "a", "modality": "text", "metadata": meta})
    done = client.post("/v1/jobs", json={"prompt": "b", "modality": "video", "priority": "high"})
    done_id = uuid.UUID(done.get_json()["id"])
    now = utcnow()
    with sessions.begin() as s:
        s.execute(
            Job.__table__.update()
            .where(Job.id == done_id)
            .values(
                status="succeeded", stage="video", progress=100, attempts=2, output_text="a shot\nof b",
                artifact_path=f"{done_id}/video.mp4", started_at=now, text_completed_at=now,
                completed_at=now, text_s=0.125, video_s=1.5, updated_at=now,
            )
        )  # fmt: skip

    def bodies() -> list[Any]:
        return [client.get(f"/v1/jobs/{j.get_json()['id']}").get_json() for j in (queued, done)]

    direct = bodies()
    assert len(driver_reads) == 2
    with statements(app) as seen:  # a listener on the app's engine: the reads go through SQLAlchemy
        through_sqlalchemy = bodies()
    assert len(driver_reads) == 2 and any("FROM jobs" in statement for statement, _ in seen)
    assert direct == through_sqlalchemy
    assert direct[0]["metadata"] == {"k": "x", "n": "1"} and direct[0]["queue_position"] is not None
    assert direct[1]["status"] == "succeeded" and direct[1]["outputs"]["text"] == "a shot\nof b"


def test_a_new_jobs_answer_is_built_from_its_values_alike() -> None:
    """A submit's job is never in a session: app.job_access reads it as a row of its values for
    the answer, which must be the answer the ORM object gives, unset attributes included."""
    from app.job_access import _readable
    from models.resource import job_model

    now = utcnow()
    job = Job(
        id=uuid.uuid4(), tenant_id=uuid.uuid4(), status="queued", modality="video", prompt="a fox",
        params={"width": 64, "seed": 1}, models={"video": {"asked": "tiny"}}, priority="high",
        meta={"k": "v"}, variants=None, progress=0, attempts=0, cached=False, created_at=now, updated_at=now,
    )  # fmt: skip
    row = _readable(job)
    assert row is not job and not isinstance(row, Job)
    assert job_model(row, "http://h", 4).public() == job_model(job, "http://h", 4).public()


def test_a_driver_read_that_loses_the_database_answers_503(client, monkeypatch) -> None:
    """The read through psycopg fails as SQLAlchemy's would: an outage is a 503 with Retry-After
    (app.errors, tasks.contract.transient), not an unhandled driver error."""
    import psycopg

    job = client.post("/v1/jobs", json={"prompt": "a", "modality": "text"}).get_json()

    def down(*args: Any, **kwargs: Any) -> Any:
        raise psycopg.OperationalError("server closed the connection unexpectedly")

    monkeypatch.setattr(psycopg.Connection, "execute", down)
    resp = client.get(f"/v1/jobs/{job['id']}")
    assert resp.status_code == 503 and int(resp.headers["Retry-After"]) > 0
    monkeypatch.undo()
    assert client.get(f"/v1/jobs/{job['id']}").status_code == 200  # the next read answers
