"""A stage's entry commits alone (one statement with its event, in autocommit: no BEGIN or COMMIT
round trips) unless outbox rows must commit with it: then in a transaction."""

from __future__ import annotations

import os

import psycopg
import pytest
from sqlalchemy import func, select

from models import Job, Stage, states
from models.db import alone, transaction
from models.webhook import WebhookMessage
from tasks.pipeline import enter_stage
from tasks.runtime import Runtime
from tests.support.jobs import create_job, get

WEBHOOK = {"url": "https://hooks.example.com/genqueue", "events": ["job.succeeded"]}


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


def test_the_first_stage_is_entered_alone_with_its_event(rt, sessions, monkeypatch) -> None:
    jid = create_job(sessions, "video")
    seen = _spy(monkeypatch, "start_text")
    job = enter_stage(rt, jid, Stage.TEXT)
    assert job is not None and (job.status, job.stage, job.attempts) == ("running", "text", 1)
    assert seen == [psycopg.pq.TransactionStatus.IDLE]  # the event is in the same statement
    assert get(sessions, jid).status == "running"


def test_a_job_with_a_webhook_enters_in_a_transaction_with_its_outbox_rows(rt, sessions, monkeypatch) -> None:
    with transaction(sessions) as s:
        job = Job(modality="video", prompt="a fox", params={}, webhook=WEBHOOK)
        s.add(job)
        s.flush()
        jid = job.id
    seen = _spy(monkeypatch, "start_text")
    entered = enter_stage(rt, jid, Stage.TEXT)
    assert entered is not None and entered.attempts == 1
    assert seen == [psycopg.pq.TransactionStatus.INTRANS]  # tried alone first: it wrote nothing
    with sessions() as s:
        assert s.scalar(select(func.count()).where(WebhookMessage.job_id == jid)) == 1


@pytest.mark.parametrize(("cache_key", "status"), [(None, "IDLE"), ("k" * 64, "INTRANS")])
def test_a_finishing_job_with_a_cache_key_completes_in_a_transaction_first(
    rt, sessions, monkeypatch, cache_key, status
):
    with transaction(sessions) as s:
        job = Job(modality="video", prompt="a fox", params={}, cache_key=cache_key)
        s.add(job)
        s.flush()
        jid = job.id
    with transaction(sessions) as s:
        assert states.start_text(s, jid) is not None
        assert states.complete_text(s, jid, "a shot", 0.1, final=False, progress=20)
    entered = enter_stage(rt, jid, Stage.VIDEO)
    assert entered is not None
    seen = _spy(monkeypatch, "complete_render")
    calls = []

    def finish(s) -> bool:
        calls.append(s)
        return states.complete_render(s, jid, Stage.VIDEO, f"{jid}/video.mp4", 10, 0.1, 9)

    assert alone(sessions, finish, likely=states.may_commit_alone(entered, finishing=True))
    # One try: alone, or straight in the transaction a cache key's followers need.
    assert len(calls) == 1 and seen == [getattr(psycopg.pq.TransactionStatus, status)]
    assert get(sessions, jid).status == "succeeded"
