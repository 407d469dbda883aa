"""A shaped transition in one statement (models.transition_cte) writes what the ORM path writes."""
from __future__ import annotations

import uuid

import psycopg
from sqlalchemy import select

from models import Job, JobEvent, states
from models.db import transaction
from models.events import CHANNEL
from models.webhook import WebhookMessage

_VARYING = {"id", "queue_seq", "created_at", "updated_at", "started_at", "text_completed_at", "completed_at"}
WEBHOOK = {"url": "https://hooks.example.com/genqueue", "events": ["job.succeeded"]}


def _job(sessions) -> uuid.UUID:
    with transaction(sessions) as s:
        job = Job(modality="text", prompt="a cat", params={}, webhook=WEBHOOK)
        s.add(job)
        s.flush()
        return job.id


def _run(sessions, jid: uuid.UUID, *, hold_the_job: bool) -> tuple[dict, Job]:
    """start_text and a final complete_text; holding the job in the session takes the ORM path."""
    with transaction(sessions) as s:
        held = s.get(Job, jid) if hold_the_job else None  # referenced: the identity map is weak
        started = states.start_text(s, jid)
        assert started is not None and (started is held) == hold_the_job
        started_row = _row(started)
        assert states.complete_text(s, jid, "out", 0.25, final=True, progress=20)
    return started_row, _load(sessions, jid)


def _load(sessions, jid: uuid.UUID) -> Job:
    with sessions() as s:
        job = s.get(Job, jid)
        assert job is not None
        return job


def _row(job: Job) -> dict:
    return {a.key: getattr(job, a.key) for a in Job.__mapper__.column_attrs if a.key not in _VARYING}


def _written(sessions, jid: uuid.UUID) -> tuple[list, list]:
    with sessions() as s:
        events = s.execute(
            select(JobEvent.id, JobEvent.type, JobEvent.from_status, JobEvent.to_status, JobEvent.stage,
                   JobEvent.data).where(JobEvent.job_id == jid).order_by(JobEvent.id)
        ).all()
        messages = s.execute(
            select(WebhookMessage.id, WebhookMessage.type, WebhookMessage.snapshot)
            .where(WebhookMessage.job_id == jid).order_by(WebhookMessage.id)
        ).all()
    return [tuple(e) for e in events], [tuple(m) for m in messages]


def test_both_paths_leave_the_same_row_events_and_outbox_messages(sessions) -> None:
    fast, orm = _job(sessions), _job(sessions)
    fast_started, fast_done = _run(sessions, fast, hold_the_job=False)
    orm_started, orm_done = _run(sessions, orm, hold_the_job=True)
    assert fast_started == orm_started
    assert fast_started["status"] == "running" and fast_started["attempts"] == 1
    assert _row(fast_done) == _row(orm_done)
    fast_events, fast_messages = _written(sessions, fast)
    orm_events, orm_messages = _written(sessions, orm)
    assert [e[1:] for e in fast_events] == [e[1:] for e in orm_events] == [
        ("job.started", "queued", "running", "text", {}),
        ("job.text.completed", "running", "succeeded", "text", {}),
        ("job.succeeded", "running", "succeeded", "text", {}),
    ]
    # Each message carries its event's id and type, with the row as the transition left it.
    assert [(m[0], m[1]) for m in fast_messages] == [(e[0], e[1]) for e in fast_events]
    assert [m[1] for m in fast_messages] == [m[1] for m in orm_messages]
    strip = lambda snap: {k: v for k, v in snap.items() if k not in _VARYING}  # noqa: E731
    assert [strip(m[2]) for m in fast_messages] == [strip(m[2]) for m in orm_messages]
    assert fast_messages[0][2]["status"] == "running" and fast_messages[-1][2]["status"] == "succeeded"


def test_a_transition_with_events_is_one_statement_and_notifies_on_commit(
    sessions, settings, monkeypatch
) -> None:
    jid = _job(sessions)
    sent: list[str] = []
    execute = psycopg.Cursor.execute

    def counted(self, query, *args, **kwargs):
        sent.append(str(query))
        return execute(self, query, *args, **kwargs)

    with psycopg.connect(_plain(settings.database_url), autocommit=True) as listener:
        listener.execute(f"LISTEN {CHANNEL}")
        monkeypatch.setattr(psycopg.Cursor, "execute", counted)
        with transaction(sessions) as s:
            assert states.start_text(s, jid) is not None
            assert not list(listener.notifies(timeout=0.2, stop_after=1)), "delivered before commit"
        monkeypatch.undo()
        notes = list(listener.notifies(timeout=5, stop_after=1))
    # On the driver (models.driver_sql): the UPDATE with its event and notification, then the
    # webhook's outbox message; two statements, not five.
    assert len(sent) == 2, sent
    assert "pg_notify" in sent[0] and "INSERT INTO job_events" in sent[0] and "webhook_messages" in sent[1]
    assert [n.payload for n in notes] == [str(jid)]


def _plain(url: str) -> str:
    return url.replace("postgresql+psycopg://", "postgresql://")


def test_a_resume_without_an_event_leaves_the_row_the_orm_path_leaves(sessions) -> None:
    fast, orm = _job(sessions), _job(sessions)
    rows = []
    for jid, hold in ((fast, False), (orm, True)):
        with transaction(sessions) as s:
            held = s.get(Job, jid) if hold else None
            assert states.start_text(s, jid) is not None
            resumed = states.resume_stage(s, jid, states.Stage.TEXT)
            assert resumed is not None and (resumed is held) == hold
            rows.append(_row(resumed))
    assert rows[0] == rows[1] and rows[0]["attempts"] == 2
    assert [e[1] for e in _written(sessions, fast)[0]] == ["job.started"]  # a resume logs no event


def test_a_transition_that_does_not_happen_writes_and_notifies_nothing(sessions) -> None:
    jid = _job(sessions)
    _run(sessions, jid, hold_the_job=False)
    with transaction(sessions) as s:
        assert states.start_text(s, jid) is None  # not queued any more
        assert states.resume_stage(s, jid, states.Stage.TEXT) is None  # finished
    events, _ = _written(sessions, jid)
    assert len(events) == 3


def test_the_returned_job_is_detached_and_attaches_without_an_insert(sessions) -> None:
    jid = _job(sessions)
    with transaction(sessions) as s:
        started = states.start_text(s, jid)
        assert started is not None and started not in s
    with transaction(sessions) as s:
        s.add(started)  # detached with its identity: attached as persistent, never inserted
        started.progress = 7
    assert _load(sessions, jid).progress == 7


def test_a_job_held_in_the_session_is_refreshed_by_the_orm_path(sessions) -> None:
    jid = _job(sessions)
    with transaction(sessions) as s:
        held = s.get(Job, jid)
        assert held is not None and held.status == "queued"
        assert states.start_text(s, jid) is held
        assert held.status == "running" and held.attempts == 1


def test_a_transition_that_loses_the_database_raises_a_transient_error(sessions, settings) -> None:
    """Through the driver (models.driver_sql) a server gone is SQLAlchemy's error, which the
    workers retry (tasks.contract.transient), and its connection is invalidated, not reused."""
    import time

    import pytest
    import sqlalchemy.exc
    from sqlalchemy import text

    from tasks.contract.transient import is_transient

    jid = _job(sessions)
    s = sessions()
    try:
        pid = s.execute(text("SELECT pg_backend_pid()")).scalar()
        with psycopg.connect(_plain(settings.database_url), autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
                time.sleep(0.01)
        with pytest.raises(sqlalchemy.exc.OperationalError) as raised:
            states.start_text(s, jid)
        assert raised.value.connection_invalidated and is_transient(raised.value)
    finally:
        s.close()
    with transaction(sessions) as s:
        assert states.start_text(s, jid) is not None  # a new connection, and the job still queued
