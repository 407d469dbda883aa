"""A stage's entry: the first stage's in a transaction (its event and outbox go with it), a later
stage's in autocommit (one statement, atomic by itself: no BEGIN or COMMIT round trips)."""

from __future__ import annotations

import os

import psycopg
import pytest

from models import Stage, states
from models.db import transaction
from tasks.pipeline import enter_stage
from tasks.runtime import Runtime
from tests.support.jobs import create_job, get


@pytest.fixture
def rt(settings, engine, sessions, celery_app) -> Runtime:
    return Runtime(settings, engine, sessions, os.getpid(), celery_app)


def _spy(monkeypatch, name: str) -> list[psycopg.pq.TransactionStatus]:
    """The driver connection's transaction status right after each call of states.`name`."""
    seen: list[psycopg.pq.TransactionStatus] = []
    original = getattr(states, name)

    def spy(s, *args, **kwargs):
        job = original(s, *args, **kwargs)
        seen.append(s.connection().connection.driver_connection.info.transaction_status)
        return job

    monkeypatch.setattr(states, name, spy)
    return seen


def test_a_later_stage_is_entered_in_autocommit(rt, sessions, monkeypatch) -> None:
    jid = create_job(sessions, "video")
    with transaction(sessions) as s:
        assert states.start_text(s, jid) is not None
        assert states.complete_text(s, jid, "a shot", 0.1, final=False, progress=20)
    seen = _spy(monkeypatch, "resume_stage")
    job = enter_stage(rt, jid, Stage.VIDEO)
    assert job is not None and (job.status, job.stage, job.attempts) == ("running", "video", 1)
    assert seen == [psycopg.pq.TransactionStatus.IDLE]  # committed by the statement itself
    stored = get(sessions, jid)
    assert (stored.attempts, stored.deadline_at) == (1, job.deadline_at)
    # A message for a stage the job is not in finds nothing to do, and changes nothing.
    assert enter_stage(rt, jid, Stage.IMAGE) is None
    assert get(sessions, jid).attempts == 1


def test_the_first_stage_is_entered_in_a_transaction(rt, sessions, monkeypatch) -> None:
    jid = create_job(sessions, "video")
    seen = _spy(monkeypatch, "start_text")
    job = enter_stage(rt, jid, Stage.TEXT)
    assert job is not None and (job.status, job.stage, job.attempts) == ("running", "text", 1)
    assert seen == [psycopg.pq.TransactionStatus.INTRANS]  # its event (and any outbox rows) commit with it
    assert get(sessions, jid).status == "running"
