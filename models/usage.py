"""A tenant's usage over a time window: jobs by outcome, GPU seconds, tokens, frames, images, cache hits.

Computed from what the worker records on each job (models.job's usage columns), so there is one
definition of each number:
- a job belongs to the window its `created_at` falls in, [from, to), and to the UTC day of it;
- `gpu_s`: every attempt's share of the generate() calls it rode in (tasks.batching.Meter),
  retried, failed and canceled attempts included; a cached job or coalesced follower ran nothing;
- `tokens` / `frames` / `images`: what the successful text / video / image attempt produced;
- `cache_hits`: jobs answered by an identical one (a finished copy or a coalesced follower).
The query reads the tenant's jobs in the window through ix_jobs_tenant_created.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import Field
from sqlalchemy import ColumnElement, Row, case, func, literal, select
from sqlalchemy.orm import Session

from models.job import Job, JobStatus, Modality, Stage
from models.resource import Resource

DEFAULT_DAYS = 30  # the window when `from` is not given: the 30 days before `to`
MAX_DAYS = 366  # the longest window one query may cover


class GroupBy(StrEnum):
    DAY = "day"
    MODEL = "model"
    MODALITY = "modality"


class WindowError(ValueError):
    """A window that cannot be queried; `field` names the offending bound."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field, self.message = field, message


def parse_time(value: str) -> datetime:
    """An ISO 8601 date-time or date (RFC 3339's lower-case `t` and `z` too); ValueError if not."""
    return datetime.fromisoformat(value.strip().upper())


def window(
    start: datetime | None, end: datetime | None, now: datetime | None = None
) -> tuple[datetime, datetime]:
    """The [start, end) window in UTC: defaults, then its bounds checked. A naive time is UTC."""
    end = _utc(end, "to") if end is not None else (now or datetime.now(UTC))
    try:
        start = _utc(start, "from") if start is not None else end - timedelta(days=DEFAULT_DAYS)
    except OverflowError:
        message = f"must leave room for the default {DEFAULT_DAYS}-day window before it"
        raise WindowError("to", message) from None
    if start >= end:
        raise WindowError("to", "must be later than from")
    if end - start > timedelta(days=MAX_DAYS):
        raise WindowError("to", f"must be at most {MAX_DAYS} days after from")
    return start, end


def _utc(value: datetime, field: str) -> datetime:
    if value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    try:
        return value.astimezone(UTC)
    except OverflowError:  # 0001-01-01T00:00+01:00 is before the first representable instant
        raise WindowError(field, "is out of range") from None


def _day(session: Session) -> ColumnElement[str]:
    if session.get_bind().dialect.name == "postgresql":
        return func.to_char(func.timezone("UTC", Job.created_at), "YYYY-MM-DD")
    return func.substr(Job.created_at, 1, 10)  # SQLite keeps UTC as "YYYY-MM-DD HH:MM:SS..."


def _columns(stage: Stage | None) -> list[Any]:
    """The aggregates of one usage row; for a model row, only that stage's GPU, tokens, frames."""
    zero_f, zero_i = literal(0.0), literal(0)
    text = stage in (None, Stage.TEXT)
    video = stage in (None, Stage.VIDEO)
    image = stage in (None, Stage.IMAGE)
    return [
        func.count().label("total"),
        *[func.sum(case((Job.status == s.value, 1), else_=0)).label(s.value) for s in JobStatus],
        (func.sum(Job.text_gpu_s) if text else zero_f).label("text_gpu_s"),
        (func.sum(Job.video_gpu_s) if video else zero_f).label("video_gpu_s"),
        (func.sum(Job.image_gpu_s) if image else zero_f).label("image_gpu_s"),
        (func.sum(Job.tokens_generated) if text else zero_i).label("tokens"),
        (func.sum(Job.frames_rendered) if video else zero_i).label("frames"),
        (func.sum(Job.images_rendered) if image else zero_i).label("images"),
        func.sum(case((Job.cached.is_(True), 1), else_=0)).label("cache_hits"),
    ]


def _row(row: Row[Any] | None) -> dict[str, Any]:
    """One usage object (every number present, 0 when nothing counted)."""

    def get(name: str) -> Any:
        return (getattr(row, name) if row is not None else None) or 0

    text_s, video_s = round(float(get("text_gpu_s")), 6), round(float(get("video_gpu_s")), 6)
    image_s = round(float(get("image_gpu_s")), 6)
    total_s = round(text_s + video_s + image_s, 6)
    return {
        "jobs": {"total": int(get("total")), **{s.value: int(get(s.value)) for s in JobStatus}},
        "gpu_s": {"text": text_s, "video": video_s, "image": image_s, "total": total_s},
        "tokens": int(get("tokens")),
        "frames": int(get("frames")),
        "images": int(get("images")),
        "cache_hits": int(get("cache_hits")),
    }


def _grouped(session: Session, where: Sequence[ColumnElement[bool]], key: Any, stage: Stage | None) -> Any:
    # A null key ("no model ran it") last on every database (Postgres and SQLite disagree).
    stmt = select(key.label("key"), *_columns(stage)).where(*where).group_by(key).order_by(key.is_(None), key)
    return session.execute(stmt)


def usage(
    session: Session, tenant_id: uuid.UUID, start: datetime, end: datetime, group_by: GroupBy | None = None
) -> dict[str, Any]:
    """The tenant's usage in [start, end): `total`, and `groups` (key ascending, none last) when grouped.

    By model, a row per stage and the model it ran on (`model` null: no model ran that stage,
    e.g. cache hits); a video job counts under its text and its video model both.
    Call on a fresh session (the caller's), read-only.
    """
    if session.get_bind().dialect.name == "postgresql":
        # One snapshot for the total and the groups, so they agree while jobs finish meanwhile.
        # (A new session's first statement: its connection takes this isolation level.)
        session.connection(execution_options={"isolation_level": "REPEATABLE READ"})
    where = [Job.tenant_id == tenant_id, Job.created_at >= start, Job.created_at < end]
    total = session.execute(select(*_columns(None)).where(*where)).one()
    groups: list[dict[str, Any]] = []
    if group_by == GroupBy.DAY:
        groups = [{"key": r.key, **_row(r)} for r in _grouped(session, where, _day(session), None)]
    elif group_by == GroupBy.MODALITY:
        groups = [{"key": r.key, **_row(r)} for r in _grouped(session, where, Job.modality, None)]
    elif group_by == GroupBy.MODEL:
        text_rows = _grouped(session, where, Job.text_model, Stage.TEXT).all()
        # Text jobs have no video stage; a storyboard's shots are its video stage.
        video_where = [*where, Job.modality.in_((Modality.VIDEO, Modality.STORYBOARD))]
        video_rows = _grouped(session, video_where, Job.video_model, Stage.VIDEO).all()
        image_where = [*where, Job.modality == Modality.IMAGE]
        image_rows = _grouped(session, image_where, Job.image_model, Stage.IMAGE).all()
        for stage, rows in ((Stage.TEXT, text_rows), (Stage.VIDEO, video_rows), (Stage.IMAGE, image_rows)):
            for r in rows:
                key = f"{stage.value}:{r.key if r.key is not None else '-'}"
                groups.append({"key": key, "stage": stage.value, "model": r.key, **_row(r)})
    return {"total": _row(total), "groups": groups}


_TIME: dict[str, Any] = {"format": "date-time"}


class UsageJobs(Resource):
    total: int
    queued: int
    running: int
    succeeded: int
    failed: int
    canceled: int


class UsageGpu(Resource):
    text: float = Field(description="GPU seconds of the text stage: every attempt's share, retries included.")
    video: float = Field(description="GPU seconds of the video stage, likewise.")
    image: float = Field(description="GPU seconds of the image stage, likewise.")
    total: float


class UsageGroup(Resource):
    key: str = Field(description="`YYYY-MM-DD` (UTC), the modality, or `<stage>:<model>` (`-`: none ran).")
    stage: Literal["text", "video", "image"] | None = Field(None, description="group_by=model only.")
    model: str | None = Field(None, description="group_by=model only; null: no model ran that stage.")
    jobs: UsageJobs
    gpu_s: UsageGpu
    tokens: int
    frames: int
    images: int
    cache_hits: int = Field(description="Jobs answered by an identical one: cached copies and followers.")


class UsageTotals(Resource):
    jobs: UsageJobs = Field(description="Jobs submitted in the window, by their status now.")
    gpu_s: UsageGpu
    tokens: int = Field(description="Tokens the text model generated.")
    frames: int = Field(description="Frames the video model rendered.")
    images: int = Field(description="Images the image model rendered.")
    cache_hits: int = Field(description="Jobs answered by an identical one: cached copies and followers.")


class Usage(Resource):
    """The calling tenant's usage (models.usage.usage_resource)."""

    object: Literal["usage"]
    from_: str = Field(alias="from", description="Start of the window (inclusive).", json_schema_extra=_TIME)
    to: str = Field(description="End of the window (exclusive), UTC.", json_schema_extra=_TIME)
    group_by: Literal["day", "model", "modality"] | None
    total: UsageTotals
    groups: list[UsageGroup] = Field(description="Key ascending; empty without group_by.")


def _iso(value: datetime) -> str:
    return value.astimezone(UTC).isoformat().replace("+00:00", "Z")


def usage_resource(
    session: Session, tenant_id: uuid.UUID, start: datetime, end: datetime, group_by: GroupBy | None = None
) -> dict[str, Any]:
    """The usage object as GET /v1/usage and `genqueue usage` give it."""
    body = usage(session, tenant_id, start, end, group_by)
    resource = {
        "object": "usage",
        "from": _iso(start),
        "to": _iso(end),
        "group_by": group_by.value if group_by is not None else None,
        **body,
    }
    # Through the model: a key it lacks is an error, and `stage`/`model` stay out of day groups.
    return Usage.model_validate(resource).public()
