"""A transition committed alone (models.db.alone): one statement in autocommit where nothing must
commit beside it, else the whole work again in a transaction, with nothing written twice."""

from __future__ import annotations

import uuid

import psycopg
from sqlalchemy import func, select
from sqlalchemy.orm import Session

from models import Job, JobEvent, Stage, states
from models.db import alone, transaction
from models.tenant import DEFAULT_TENANT_ID
from models.webhook import WebhookEndpoint, WebhookMessage

WEBHOOK = {"url": "https://hooks.example.com/genqueue", "events": ["job.succeeded"]}


def _job(sessions, **values) -> uuid.UUID:
    with transaction(sessions) as s:
        job = Job(modality="video", prompt="a fox", params={}, **values)
        s.add(job)
        s.flush()
        return job.id


def _count(sessions, model, jid: uuid.UUID) -> int:
    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(model).where(model.job_id == jid)) or 0)


def _start(jid: uuid.UUID, seen: list[tuple[bool, psycopg.pq.TransactionStatus]]):
    def work(s: Session) -> Job | None:
        job = states.start_text(s, jid)
        seen.append(
            (
                bool(s.info.get("genqueue.alone")),
                s.connection().connection.driver_connection.info.transaction_status,
            )
        )
        return job

    return work


def test_a_plain_jobs_transition_commits_by_itself(sessions) -> None:
    jid = _job(sessions)
    seen: list = []
    job = alone(sessions, _start(jid, seen))
    assert job is not None and job.status == "running"
    assert seen == [(True, psycopg.pq.TransactionStatus.IDLE)]  # no BEGIN was sent: nothing is open
    assert _count(sessions, JobEvent, jid) == 1


def test_a_job_with_a_webhook_goes_to_a_transaction_with_its_outbox_rows(sessions) -> None:
    jid = _job(sessions, webhook=WEBHOOK)
    seen: list = []
    job = alone(sessions, _start(jid, seen))
    assert job is not None and job.status == "running"
    assert seen == [(False, psycopg.pq.TransactionStatus.INTRANS)]  # the try alone wrote nothing
    assert _count(sessions, JobEvent, jid) == 1  # once: the guarded statement wrote no event
    assert _count(sessions, WebhookMessage, jid) == 1


def test_a_tenant_with_an_endpoint_goes_to_a_transaction(sessions) -> None:
    with transaction(sessions) as s:
        s.add(WebhookEndpoint(tenant_id=DEFAULT_TENANT_ID, url="https://example.com/hooks"))
    jid = _job(sessions)
    seen: list = []
    assert alone(sessions, _start(jid, seen)) is not None
    assert seen == [(False, psycopg.pq.TransactionStatus.INTRANS)]
    assert (_count(sessions, JobEvent, jid), _count(sessions, WebhookMessage, jid)) == (1, 1)


def test_a_transition_that_does_not_happen_writes_nothing_either_way(sessions) -> None:
    jid = _job(sessions)
    assert alone(sessions, _start(jid, [])) is not None
    seen: list = []
    assert alone(sessions, _start(jid, seen)) is None  # not queued any more
    assert [alone_ for alone_, _ in seen] == [False]  # the transaction said it did not happen
    assert _count(sessions, JobEvent, jid) == 1


def test_a_finished_source_settles_its_followers_in_a_transaction(sessions) -> None:
    source = _job(sessions, cache_key="k" * 64)
    follower = _job(sessions, cache_key="k" * 64, source_job_id=source)
    with transaction(sessions) as s:
        states.start_text(s, source)
        states.complete_text(s, source, "a shot", 0.1, final=False, progress=20)

    def finish(s: Session) -> bool:
        return states.complete_render(s, source, Stage.VIDEO, f"{source}/video.mp4", 10, 0.1, 9)

    assert alone(sessions, finish)
    with sessions() as s:
        assert s.get(Job, follower).status == "succeeded"  # type: ignore[union-attr]
    assert _count(sessions, JobEvent, source) == 3  # started, text completed, succeeded: once each


def test_finish_hooks_run_after_a_commit_alone(sessions) -> None:
    jid = _job(sessions)
    with transaction(sessions) as s:
        states.start_text(s, jid)
        states.complete_text(s, jid, "a shot", 0.1, final=False, progress=20)
    finished: list[str] = []

    def hook(session: Session, job: Job, followers: int) -> None:
        from sqlalchemy import event

        event.listen(session, "after_commit", lambda _s: finished.append(job.status), once=True)

    states.on_finish(hook)
    try:
        assert alone(sessions, lambda s: states.complete_render(s, jid, Stage.VIDEO, "v.mp4", 10, 0.1, 9))
    finally:
        states._finish_hooks.remove(hook)
    assert finished == ["succeeded"]
