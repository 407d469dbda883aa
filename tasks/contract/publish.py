"""What web and workers send by task name: a job's stage chain, its compensation, webhook dispatch."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable

from celery import Celery
from celery.canvas import Signature
from kombu import Producer
from sqlalchemy.orm import Session, sessionmaker

from models import Stage, outbox
from tasks.contract import names
from tasks.contract.routing import broker_priority
from tasks.contract.stages import ENTRY_STAGE, TASKS, chained, stages_from
from tasks.contract.templates import Key, templates

log = logging.getLogger(__name__)


def _stage(app: Celery, jid: str, stage: Stage, prio: int | None, errback: Signature) -> Signature:
    """One stage's task: a fixed id per job and stage (duplicates are recognisable), the errback."""
    return app.signature(
        TASKS[stage], args=(jid,), immutable=True, task_id=names.stage_task_id(jid, stage), priority=prio,
        link_error=[errback],
    )  # fmt: skip


def publish_compensation(app: Celery, job_id: uuid.UUID | str) -> None:
    """Ask a worker to compensate a canceled job; one quick try (the reaper catches a miss)."""
    app.send_task(
        names.COMPENSATE,
        args=(str(job_id),),
        task_id=names.stage_task_id(str(job_id), "compensate"),
        retry=False,
    )


def publish_postprocess(app: Celery, job_id: uuid.UUID | str) -> bool:
    """Ask a CPU worker (the post queue) to make a succeeded job's output variants; one quick try.

    Right after the job's success commit: the job is done whatever happens here, so a broker
    failure is logged and the variants stay pending (a redelivered video stage asks again).
    Returns whether the message went out.
    """
    try:
        app.send_task(
            names.POSTPROCESS,
            args=(str(job_id),),
            task_id=names.stage_task_id(str(job_id), "postprocess"),
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.2},
        )
    except Exception:
        log.warning("job %s: postprocess not published; its variants stay pending", job_id, exc_info=True)
        return False
    return True


def publish_job(
    app: Celery,
    job_id: uuid.UUID | str,
    modality: str,
    priority: str,
    stage: Stage | str = ENTRY_STAGE,
    producer: Producer | None = None,
    declared: set[Key] | None = None,
) -> None:
    """Send the job from `stage` on (text -> video, or the video stage alone for the reaper).

    The stages come from the modality's pipeline (tasks.contract.stages.PIPELINES). The message
    is what `_send_stages` sends through Celery, recorded once per shape and sent with this job's
    id put in (tasks.contract.templates). Raises kombu/OS errors if the broker cannot take it in
    time: broker_connection_timeout per try, two quick retries, so a broker outage becomes a 503
    within seconds, not a hung request.
    `producer`: one already acquired (publish_jobs); None takes one from the pool per call.
    `declared`: the shapes whose queue this producer declared already (publish_jobs): kombu's
    maybe_declare per message cost a tenth of a batch's publishing.
    """
    jid, table = str(job_id), templates(app)
    if not table.usable:
        _send_stages(app, jid, modality, priority, stage, producer)
        return
    key: Key = (modality, priority, str(stage))
    declare = declared is None or key not in declared
    if declared is not None:
        declared.add(key)
    with app.producer_or_acquire(producer) as p:

        def send(recorder: Producer, placeholder: str) -> None:
            _send_stages(app, placeholder, modality, priority, stage, recorder)

        template = table.get(key, p, send)
        with p.connection._reraise_as_library_errors():  # as send_task: kombu's errors for redis-py's
            template.publish(app, p, jid, declare)


def _send_stages(
    app: Celery, jid: str, modality: str, priority: str, stage: Stage | str, producer: Producer | None
) -> None:
    """The first stage's task, carrying the rest as its chain: exactly what chain(text, video)
    sends, built directly (the canvas's generic preparation cost a fifth of the publish)."""
    prio = broker_priority(priority, app.conf.broker_url)
    errback = app.signature(names.COMPENSATE, args=(jid,), immutable=True)
    start, *rest = chained(stages_from(modality, stage))
    first = _stage(app, jid, start, prio, errback)
    # A message's chain is a stack: the next task is popped from its end.
    then = [_stage(app, jid, later, prio, errback) for later in reversed(rest)] or None
    assert first.task is not None  # _stage names it
    app.send_task(
        first.task,
        args=first.args,
        chain=then,
        retry=True,
        retry_policy={"max_retries": 2, "interval_start": 0, "interval_step": 0.2, "interval_max": 0.5},
        producer=producer,
        # What celery's saferepr would write, without its cost: the args are one short id.
        argsrepr=repr(first.args),
        kwargsrepr="{}",
        **first.options,
    )


def publish_jobs(
    app: Celery, jobs: Iterable[tuple[uuid.UUID, str, str]], published: Callable[[list[uuid.UUID]], None]
) -> None:
    """publish_job for each (id, modality, priority) in order, over one connection and producer.

    Where the transport can (Redis: kombu's Producer.batch, one pipeline), every message goes
    in one round trip, and `published(ids)` is called once they all are out; a failure raises
    with none reported. Elsewhere (AMQP) `published([id])` follows each message, and the first
    failure raises, leaving the jobs after it unpublished.
    """
    jobs, declared = list(jobs), set[Key]()
    with app.producer_or_acquire() as producer:
        if producer.supports_batch_publish:
            with producer.batch(max_size=max(1, 2 * len(jobs))):  # one flush: a message is 1-2 commands
                for job_id, modality, priority in jobs:
                    publish_job(app, job_id, modality, priority, producer=producer, declared=declared)
            published([job_id for job_id, _, _ in jobs])
            return
        for job_id, modality, priority in jobs:
            publish_job(app, job_id, modality, priority, producer=producer, declared=declared)
            published([job_id])


def publish_dispatch(app: Celery, job_ids: Iterable[uuid.UUID], countdown: float | None = None) -> None:
    """Send one webhook dispatch per job to the webhooks queue, by task name (no import of the task)."""
    for job_id in job_ids:
        app.send_task(
            names.DELIVER_WEBHOOK,
            args=(str(job_id),),
            countdown=countdown,
            # Right after a commit, on a GPU worker's or a request's path: one quick try. If the
            # broker is down the message waits in the outbox and the relay sends it later.
            retry=True,
            retry_policy={"max_retries": 1, "interval_start": 0, "interval_step": 0.2},
        )


def wake_dispatch_on_commit(sessions: sessionmaker[Session], app: Celery) -> None:
    """Every commit through `sessions` that wrote outbox messages wakes their jobs' dispatchers."""
    outbox.on_commit(sessions, lambda job_ids: publish_dispatch(app, job_ids))
