"""The job state machine: every transition is one conditional UPDATE plus its event row.

queued -> running(text) -> running(video | image) -> succeeded | failed | canceled.
A transition whose WHERE clause matches no row did not happen (the job was already
past that point), so a redelivered or duplicated task can never move a job backwards
or finish it twice. Callers commit; the event is in the same transaction (outbox).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from datetime import datetime
from functools import cache
from typing import Any, cast

from sqlalchemy import ColumnElement, and_, bindparam, delete, func, true
from sqlalchemy.orm import Session

from models import events, outbox, transition_cte
from models.base import utcnow
from models.cache import settle_followers
from models.db import NeedsTransaction, is_alone, rowcount
from models.job import ACTIVE, TERMINAL, Job, JobStatus, Stage
from models.transition_sql import Bound, statement

Deadline = datetime | Bound  # a value, or an expression on the row's old values (recovery.entry_deadline)

# Observers of finished jobs (the workers' metrics, tasks.metrics): called with the session, the
# job row as its terminal transition left it and how many cache followers finished with it.
FinishHook = Callable[[Session, Job, int], None]
_finish_hooks: list[FinishHook] = []


def on_finish(hook: FinishHook) -> FinishHook:
    """Register a finish observer (idempotent). It runs inside the transition's transaction."""
    if hook not in _finish_hooks:
        _finish_hooks.append(hook)
    return hook


@cache
def _where(status: str, stage: str | None = None) -> ColumnElement[bool]:
    """A transition's WHERE on status (and stage), built once: SQL expressions are immutable, and
    building them per call was a few percent of a pipeline worker's CPU."""
    return Job.status == status if stage is None else and_(Job.status == status, Job.stage == stage)


@cache
def _active() -> ColumnElement[bool]:
    """Any active job (fail, cancel): built once, as _where."""
    return Job.status.in_(ACTIVE)


@cache
def _next_attempt() -> ColumnElement[int]:
    """The row's attempt count plus one (a stage entry): built once, as _where."""
    return Job.attempts + 1


@cache
def _alone(where: ColumnElement[bool], terminal: bool) -> ColumnElement[bool]:
    """`where` and what a transition with events tried alone (models.db.alone) also requires:
    that nothing must commit beside it. No outbox rows (the job has no webhook of its own, its
    tenant no registered endpoint) and, finishing the job, no cache followers to finish with it
    (no cache key). Built once per WHERE (those of _where are built once), as _where."""
    guard = and_(where, Job.webhook.is_(None), ~outbox.registered_exists())
    return and_(guard, Job.cache_key.is_(None)) if terminal else guard


def may_commit_alone(job: Job, *, finishing: bool) -> bool:
    """Whether a transition of `job` (read earlier) likely passes _alone's guard, as far as this
    process knows: tried alone when it does not, the statement writes nothing and costs a round
    trip (models.db.alone's `likely`). The guard in the statement decides."""
    if job.webhook is not None or outbox.endpoint_seen(job.tenant_id):
        return False
    return not (finishing and job.cache_key is not None)


def _transition(
    session: Session,
    job_id: uuid.UUID,
    where: ColumnElement[bool],
    values: dict[str, Any],
    event: str | None,
    *,
    from_status: str | None = None,
    event_data: dict[str, Any] | None = None,
    then: tuple[str, ...] = (),
    event_at: datetime | None = None,
    shape: Hashable | None = None,
) -> bool:
    """`shape`: this call's statement is built once and reused (models.transition_sql)."""
    if not event:
        stmt, params = statement(job_id, where, values, shape=shape)
        return rowcount(session.execute(stmt, params)) == 1
    job = _transition_row(
        session, job_id, where, values, event,
        from_status=from_status, event_data=event_data, then=then, event_at=event_at, shape=shape,
    )  # fmt: skip
    return job is not None


def _transition_row(
    session: Session,
    job_id: uuid.UUID,
    where: ColumnElement[bool],
    values: dict[str, Any],
    event: str | None,
    *,
    from_status: str | None = None,
    event_data: dict[str, Any] | None = None,
    then: tuple[str, ...] = (),
    event_at: datetime | None = None,
    shape: Hashable | None = None,
) -> Job | None:
    """The transition, returning the job row as it left it; None when it did not happen.

    A shaped transition is one statement where it may be (models.transition_cte)."""
    if is_alone(session) and event and (shape is None or not transition_cte.applies(session, values)):
        raise NeedsTransaction  # its event (and outbox) would be statements of their own
    if shape is not None and transition_cte.applies(session, values):
        return _in_one_statement(
            session, job_id, where, values, (event, *then) if event else (),
            from_status=from_status, event_data=event_data, at=event_at or utcnow(), shape=shape,
        )  # fmt: skip
    if not event:
        stmt, params = statement(job_id, where, values, shape=shape, returning=(Job,))
        return cast("Job | None", session.execute(stmt, params).scalar())
    # RETURNING the row gives the webhook outbox its snapshot, and whether the tenant has an
    # endpoint, without another round trip.
    check = outbox.registered_column(session)
    if check is None:
        stmt, params = statement(job_id, where, values, shape=shape, returning=(Job,))
        job, registered = session.execute(stmt, params).scalar(), None
    else:
        stmt, params = statement(job_id, where, values, shape=shape, returning=(Job, check))
        job, registered = session.execute(stmt, params).first() or (None, None)
    if job is None:
        return None
    at = event_at or utcnow()
    common = {
        "job_id": job_id,
        "from_status": from_status,
        "to_status": values.get("status"),
        "stage": values.get("stage", job.stage),
        "created_at": at,
    }
    events = [{**common, "type": name, "data": dict(event_data or {})} for name in (event, *then)]
    outbox.add_events(session, job, events, registered)
    return cast(Job, job)  # the statement is typed as a plain Update: its rows are Any


def _in_one_statement(
    session: Session,
    job_id: uuid.UUID,
    where: ColumnElement[bool],
    values: dict[str, Any],
    names: tuple[str, ...],
    *,
    from_status: str | None,
    event_data: dict[str, Any] | None,
    at: datetime,
    shape: Hashable,
) -> Job | None:
    """_transition_row as one statement (models.transition_cte), then the outbox's messages.

    The job it returns is detached, not in `session`: read it, do not change it expecting a flush."""
    if not names:
        return transition_cte.without_events(session, job_id, where, values, shape)
    registered = outbox.registered_column(session)
    assert registered is not None  # Postgres (transition_cte.applies)
    alone = is_alone(session)
    if alone:  # committed by itself: only where nothing else must commit with it
        where = _alone(where, values.get("status") in TERMINAL)
        shape = ("alone", shape)
    done = transition_cte.with_events(
        session, job_id, where, values, names, shape=shape, registered=registered,
        from_status=from_status, data=dict(event_data or {}), at=at,
    )  # fmt: skip
    if done is None:
        if alone:  # the guard, or the transition itself: the transaction tells which
            raise NeedsTransaction
        return None
    job, written, has_endpoint = done
    outbox.saw_endpoint(job.tenant_id, has_endpoint)
    if outbox.wanted(job, has_endpoint):
        outbox.add_messages(session, job, [(id_, type_, at) for id_, type_ in written])
    return job


def _settle(session: Session, job: Job | None) -> bool:
    """After a transition that finished `job` (None: it did not happen): its cache followers, observers."""
    if job is None:
        return False
    # Only jobs with a cache key can have followers: most finish without another query.
    followers = 0
    if job.cache_key is not None:
        followers = settle_followers(session, job.id)  # identical jobs waiting on this one finish with it
    for hook in _finish_hooks:
        hook(session, job, followers)
    return True


def mark_published(session: Session, job_id: uuid.UUID) -> bool:
    return _transition(
        session,
        job_id,
        and_(Job.status == JobStatus.QUEUED, Job.published_at.is_(None)),
        {"published_at": utcnow()},
        None,
        shape="mark_published",
    )


def start_text(session: Session, job_id: uuid.UUID, *, deadline_at: Deadline | None = None) -> Job | None:
    """queued -> running(text): the job as it left, or None if it is not queued (see resume_stage).

    `deadline_at`: the stage's deadline (models.recovery.entry_deadline), set in the same UPDATE.
    """
    now = utcnow()
    values: dict[str, Any] = {
        "status": JobStatus.RUNNING, "stage": Stage.TEXT, "started_at": now, "attempts": _next_attempt(),
    }  # fmt: skip
    if deadline_at is not None:
        values["deadline_at"] = deadline_at
    return _transition_row(
        session,
        job_id,
        _where(JobStatus.QUEUED),
        values,
        "job.started",
        from_status=JobStatus.QUEUED,
        shape="start_text",
    )


def resume_stage(
    session: Session, job_id: uuid.UUID, stage: Stage, *, deadline_at: Deadline | None = None
) -> Job | None:
    """A redelivered task re-enters the stage it was running; counted as an attempt, no event.

    Returns the job as it left, or None when it is not running that stage.
    """
    values: dict[str, Any] = {"attempts": _next_attempt()}
    if deadline_at is not None:
        values["deadline_at"] = deadline_at
    where = _where(JobStatus.RUNNING, stage)
    return _transition_row(session, job_id, where, values, None, shape=("resume_stage", stage))


@dataclass(frozen=True)
class Charge:
    """What one stage attempt cost: its GPU seconds (tasks.batching.Meter) and the model it ran on."""

    gpu_s: float
    model: str
    models: dict[str, Any] | None = None  # jobs.models recording what this attempt ran (tasks.job_models)


@dataclass(frozen=True)
class StageColumns:
    """Where one stage's seconds, GPU usage, model and output count are kept on the job row."""

    seconds: str
    gpu_s: str
    model: str
    outputs: str | None = None  # the render stages' frame or image count


STAGE_COLUMNS: dict[Stage, StageColumns] = {
    Stage.TEXT: StageColumns("text_s", "text_gpu_s", "text_model", "tokens_generated"),
    Stage.VIDEO: StageColumns("video_s", "video_gpu_s", "video_model", "frames_rendered"),
    Stage.IMAGE: StageColumns("image_s", "image_gpu_s", "image_model", "images_rendered"),
    # A storyboard's shots and stitch make its video: the video columns hold them.
    Stage.SHOTS: StageColumns("video_s", "video_gpu_s", "video_model", "frames_rendered"),
    Stage.STITCH: StageColumns("video_s", "video_gpu_s", "video_model", "frames_rendered"),
}


def _charge_values(stage: Stage, charge: Charge) -> dict[str, Any]:
    cols = STAGE_COLUMNS[stage]
    column = getattr(Job, cols.gpu_s)
    added = Bound(
        f"charge:{cols.gpu_s}",
        lambda: func.coalesce(column, 0.0) + bindparam("charge_gpu_s", type_=column.type),
        {"charge_gpu_s": round(charge.gpu_s, 6)},
    )
    values = {cols.gpu_s: added, cols.model: charge.model}
    return values | ({"models": charge.models} if charge.models is not None else {})


def charge_attempt(session: Session, job_id: uuid.UUID, stage: Stage, charge: Charge) -> None:
    """Add one stage attempt's GPU seconds to the job and name the model it ran on.

    Unconditional: an attempt that generated used the GPU whatever became of the job since
    (retried, failed, canceled, overtaken). The worker charges once per attempt that reached
    generation (here, or in the completion's own UPDATE); a redelivery that finds the stage done
    never gets there, and costs nothing.
    """
    stmt, params = statement(job_id, true(), _charge_values(stage, charge), shape=("charge", stage))
    session.execute(stmt, params)


def _charged(session: Session, job_id: uuid.UUID, stage: Stage, charge: Charge | None, done: bool) -> bool:
    """After a completion that carried `charge` in its UPDATE: charge anyway if it did not happen."""
    if charge is not None and not done:
        charge_attempt(session, job_id, stage, charge)
    return done


def complete_text(
    session: Session,
    job_id: uuid.UUID,
    text: str,
    seconds: float,
    *,
    final: bool,
    progress: int,
    deadline_at: datetime | None = None,
    tokens: int | None = None,
    charge: Charge | None = None,
    next_stage: Stage = Stage.VIDEO,
) -> bool:
    """running(text) -> running(next_stage), or -> succeeded when the job wants text only.

    `deadline_at`: going on, when the wait for the next stage's worker is overdue (same UPDATE).
    `tokens`: how many the model generated; `charge`: the attempt's cost, recorded in the same
    UPDATE (or by charge_attempt when the transition does not happen): usage.
    """
    now = utcnow()
    values: dict[str, Any] = {
        "output_text": text, "text_s": seconds, "text_completed_at": now, "tokens_generated": tokens,
    }  # fmt: skip
    if charge is not None:
        values |= _charge_values(Stage.TEXT, charge)
    where = _where(JobStatus.RUNNING, Stage.TEXT)
    if final:
        values |= {"status": JobStatus.SUCCEEDED, "progress": 100, "completed_at": now}
        job = _transition_row(
            session,
            job_id,
            where,
            values,
            "job.text.completed",
            from_status=JobStatus.RUNNING,
            then=("job.succeeded",),
            shape="complete_text:final",
        )
        return _charged(session, job_id, Stage.TEXT, charge, _settle(session, job))
    values |= {"stage": next_stage, "progress": progress, "attempts": 0}
    if deadline_at is not None:
        values["deadline_at"] = deadline_at
    done = _transition(
        session,
        job_id,
        where,
        values,
        "job.text.completed",
        from_status=JobStatus.RUNNING,
        shape="complete_text",
    )
    return _charged(session, job_id, Stage.TEXT, charge, done)


def set_progress(
    session: Session, job_id: uuid.UUID, stage: Stage, progress: int, *, event_at: datetime | None = None
) -> bool:
    """Progress only moves forward, and only while the job is in that stage.

    With `event_at`, also log a job.progress event stamped with that time (the caller throttles
    on the same clock, so the stamps of consecutive events are at least its interval apart).
    Without, the move is announced to the job's streams only (models.events: ephemeral).
    """
    moved = _transition(
        session,
        job_id,
        and_(Job.status == JobStatus.RUNNING, Job.stage == stage, Job.progress < progress),
        {"progress": progress},
        "job.progress" if event_at else None,
        from_status=JobStatus.RUNNING,
        event_data={"progress": progress},
        event_at=event_at,
    )
    if moved and not event_at:
        events.notify(session, job_id, progress)
    return moved


def complete_render(
    session: Session,
    job_id: uuid.UUID,
    stage: Stage,
    artifact_path: str,
    artifact_bytes: int,
    seconds: float,
    outputs: int | None = None,
    charge: Charge | None = None,
) -> bool:
    """running(video | image) -> succeeded: the final render stage wrote its files.

    `artifact_path`: the main file (the MP4, the first PNG), `artifact_bytes` all of them;
    `outputs`: how many frames or images the model rendered; `charge`: the attempt's cost, as
    complete_text's (usage).
    """
    cols = STAGE_COLUMNS[stage]
    values: dict[str, Any] = {
        "status": JobStatus.SUCCEEDED,
        "progress": 100,
        "completed_at": utcnow(),
        "artifact_path": artifact_path,
        "artifact_bytes": artifact_bytes,
        cols.seconds: seconds,
    }
    if cols.outputs is not None:
        values[cols.outputs] = outputs
    if charge is not None:
        values |= _charge_values(stage, charge)
    job = _transition_row(
        session,
        job_id,
        _where(JobStatus.RUNNING, stage),
        values,
        "job.succeeded",
        from_status=JobStatus.RUNNING,
        shape=("complete_render", stage),
    )
    return _charged(session, job_id, stage, charge, _settle(session, job))


def complete_video(
    session: Session,
    job_id: uuid.UUID,
    artifact_path: str,
    artifact_bytes: int,
    seconds: float,
    frames: int | None = None,
    charge: Charge | None = None,
) -> bool:
    """running(video) -> succeeded (complete_render of the video stage)."""
    return complete_render(
        session, job_id, Stage.VIDEO, artifact_path, artifact_bytes, seconds, frames, charge
    )


def fail(session: Session, job_id: uuid.UUID, code: str, message: str, stage: str | None) -> bool:
    """Any active job -> failed, recording where and why (and its cache followers with it)."""
    job = _transition_row(
        session,
        job_id,
        _active(),
        {
            "status": JobStatus.FAILED,
            "completed_at": utcnow(),
            "error_code": code,
            "error_message": message[:2000],
            "error_stage": stage,
        },
        "job.failed",
        event_data={"code": code, "stage": stage},
        shape="fail",
    )
    return _settle(session, job)


def cancel(session: Session, job_id: uuid.UUID) -> bool:
    """Any active job -> canceled. False when it had already finished."""
    return _transition(
        session,
        job_id,
        _active(),
        {
            "status": JobStatus.CANCELED,
            "completed_at": utcnow(),
            "error_code": "canceled",
            "error_message": "canceled by the client",
            "error_stage": Job.stage,
        },
        "job.canceled",
        shape="cancel",
    )


def withdraw(session: Session, job_id: uuid.UUID) -> None:
    """A submit whose message could not be published: the job was never accepted, so it goes.

    Nothing may stay queued without a message. Failing it first fails any identical job that
    attached to it as a cache follower meanwhile; deleting it frees its Idempotency-Key for
    the client's retry.
    """
    fail(session, job_id, "unavailable", "the job queue was unavailable", None)
    session.execute(delete(Job).where(Job.id == job_id))
