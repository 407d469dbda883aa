"""What the job endpoints (app.jobs, app.job_control, app.webhooks) share: the caller's job by id,
its resource as this API answers it (queue position, links), and the per-process queue counts and
published marks."""

from __future__ import annotations

import collections
import functools
import uuid
from collections.abc import Sequence
from typing import Any, cast

from flask import current_app
from sqlalchemy import Connection, Select, bindparam, inspect, select
from sqlalchemy.orm import Session
from werkzeug.routing import BaseConverter

from app import media
from app.auth import current_principal, tenant_id
from app.errors import NotFound
from app.published import PublishedMarks
from app.queue import QueueCounts
from app.services import extension, services
from models import Job, driver_sql, shot_states
from models.job import Modality
from models.plans import Plan
from models.resource import Job as JobResource
from models.resource import job_model


class JobIdConverter(BaseConverter):
    """`/jobs/<job_id:job_id>`: any path segment but `batch`, POST /v1/jobs/batch's (app.batch), so
    that path allows POST alone, not also the GET and DELETE of a job named "batch"."""

    regex = "(?!batch$)[^/]+"


def _job_id(raw: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"No job with id {raw!r}.") from None


@functools.cache
def _by_id() -> Select[Job]:
    # Built once (its cache key memoized with it): the hot path only binds the two values.
    return select(Job).where(Job.id == bindparam("id"), Job.tenant_id == bindparam("tenant"))


# Columns a read of the job resource never needs (a new column is read unless listed here).
_NOT_IN_RESOURCE = frozenset({
    "tenant_id", "webhook", "artifact_bytes", "updated_at", "published_at", "deadline_at", "recoveries",
    "compensated_at", "cache_key", "text_model", "video_model", "tokens_generated", "frames_rendered",
})  # fmt: skip


@functools.cache
def _resource_row() -> Select[Any]:
    """The by-id read of GET /v1/jobs/{id} as a Core statement: the columns the resource and its
    queue position read, under their attribute names (`meta` for "metadata")."""
    names = [attr.key for attr in inspect(Job).column_attrs if attr.key not in _NOT_IN_RESOURCE]
    return select(*(getattr(Job, n).label(n) for n in names)).where(
        Job.id == bindparam("id"), Job.tenant_id == bindparam("tenant")
    )


@functools.cache
def _row_type() -> Any:
    """A named tuple of _resource_row's columns, under their attribute names."""
    return collections.namedtuple("JobRow", [c.key for c in _resource_row().selected_columns])  # type: ignore[misc]


def _readable(job: Job) -> Job:
    """A job built by this request and written by a Core INSERT (never in a session: transient)
    as a row of its values. Reading an attribute never set on such an object goes through
    SQLAlchemy's loader machinery to its None, and job_model reads some 36 of them: job_model
    and the dump took 67-70 us a job in a loop, 40-54 us from the row."""
    state = inspect(job, raiseerr=False)
    if state is None or not state.transient:
        return job  # a row already, or loaded (maybe expired): its attributes read the ORM's way
    values = job.__dict__
    return cast("Job", _row_type()(*[values.get(name) for name in _row_type()._fields]))


def read_job(conn: Connection, raw_id: str) -> Job:
    """load_job for a read-only answer, without the ORM: a row (no entity loading, no identity
    map). job_model and app.queue read attributes only, which the row has under the same names;
    it is typed as the Job it stands for. The statement goes to the driver where it may
    (models.driver_sql): SQLAlchemy's execution and result machinery were half the CPU of this
    read (0.42 -> 0.22 ms a read in a loop, docs/BENCHMARKS.md)."""
    params = {"id": _job_id(raw_id), "tenant": tenant_id()}
    row = driver_sql.first_as(conn, _resource_row(), params, _row_type())
    if row is None:
        raise NotFound(f"No job with id {raw_id!r}.")
    return cast("Job", row)


def load_job(session: Session, raw_id: str) -> Job:
    """The caller's job; another tenant's is as absent as a missing one (404, never 403)."""
    job = session.scalar(_by_id(), {"id": _job_id(raw_id), "tenant": tenant_id()})
    if job is None:
        raise NotFound(f"No job with id {raw_id!r}.")
    return job


def queue_counts() -> QueueCounts:
    ext = current_app.extensions
    if "genqueue.queue" not in ext:
        ext["genqueue.queue"] = QueueCounts(services().settings.queue_position_ttl_s)
    return extension("genqueue.queue", QueueCounts)


def published_marks() -> PublishedMarks:
    ext = current_app.extensions
    if "genqueue.published" not in ext:
        ext["genqueue.published"] = PublishedMarks(services().sessions)
    return extension("genqueue.published", PublishedMarks)


def queue_positions(session: Session | Connection, jobs: list[Job]) -> dict[uuid.UUID, int]:
    """Approximate 1-based place of each queued job in the order workers take them (app.queue)."""
    return queue_counts().positions(session, jobs)


def model_of(job: Job, position: int | None, shots: Sequence[Any] | None = None) -> JobResource:
    """The job resource as this API answers it: its links, signed ones included, both lifetimes
    (expires_at, the signed links') from the caller's plan, whose jobs they are."""
    return models_of([job], {job.id: position} if position is not None else {}, shots)[0]


def models_of(
    jobs: Sequence[Job], positions: dict[uuid.UUID, int], shots: Sequence[Any] | None = None
) -> list[JobResource]:
    """model_of for each of the caller's jobs (a batch, a page), the plan and signer worked out
    once, not per job (a profile of 500-job batches had the answer at about a quarter of the
    request's CPU, outside the one-time tokenizer load)."""
    settings = services().settings
    plan = Plan.effective(settings, current_principal().plan_overrides)
    base = settings.public_base_url.rstrip("/")
    signer, signed_base = media.signer(plan.media_url_ttl_s), media.signed_base_url()
    return [
        job_model(_readable(job), base, positions.get(job.id), signer, signed_base, plan.retention_s, shots)
        for job in jobs
    ]


def resource_of(job: Job, position: int | None, shots: Sequence[Any] | None = None) -> dict[str, Any]:
    return model_of(job, position, shots).public()


def current_resource(session: Session | Connection, job: Job) -> dict[str, Any]:
    """The job's resource with its queue position now (and a storyboard's shots)."""
    shots = shot_states.rows(session, job.id) if job.modality == Modality.STORYBOARD else None
    return resource_of(job, queue_positions(session, [job]).get(job.id), shots)
