"""The `jobs` table and its append-only `job_events` log."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from functools import cache
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    Float,
    ForeignKey,
    Index,
    Integer,
    String,
    Text,
    Uuid,
    false,
    inspect,
    text,
)
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, JSONType, UTCDateTime, utcnow
from models.tenant import DEFAULT_TENANT_ID


class JobStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELED = "canceled"


TERMINAL = frozenset({JobStatus.SUCCEEDED, JobStatus.FAILED, JobStatus.CANCELED})
ACTIVE = frozenset({JobStatus.QUEUED, JobStatus.RUNNING})


class Stage(StrEnum):
    TEXT = "text"
    VIDEO = "video"
    IMAGE = "image"
    SHOTS = "shots"  # a storyboard's shots, rendered in parallel on the video queue (models.shots)
    STITCH = "stitch"  # a storyboard's shots joined into one film


class Modality(StrEnum):
    TEXT = "text"
    VIDEO = "video"
    IMAGE = "image"
    STORYBOARD = "storyboard"


class Priority(StrEnum):
    HIGH = "high"
    NORMAL = "normal"
    LOW = "low"


class Job(Base):
    __tablename__ = "jobs"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("tenants.id"), default=DEFAULT_TENANT_ID)
    status: Mapped[str] = mapped_column(String(16), default=JobStatus.QUEUED)
    stage: Mapped[str | None] = mapped_column(String(16))
    modality: Mapped[str] = mapped_column(String(16))
    prompt: Mapped[str] = mapped_column(Text)
    params: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    priority: Mapped[str] = mapped_column(String(8), default=Priority.NORMAL)
    progress: Mapped[int] = mapped_column(Integer, default=0)
    meta: Mapped[dict[str, Any]] = mapped_column("metadata", JSONType, default=dict)
    webhook: Mapped[dict[str, Any] | None] = mapped_column(JSONType)  # {url, events}: see models.webhook

    output_text: Mapped[str | None] = mapped_column(Text)
    artifact_path: Mapped[str | None] = mapped_column(String(1024))
    artifact_bytes: Mapped[int | None] = mapped_column(BigInteger)

    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    error_stage: Mapped[str | None] = mapped_column(String(16))
    attempts: Mapped[int] = mapped_column(Integer, default=0)

    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
    published_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    text_completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    text_s: Mapped[float | None] = mapped_column(Float)
    video_s: Mapped[float | None] = mapped_column(Float)
    image_s: Mapped[float | None] = mapped_column(Float)

    # Reliability: when the current stage is overdue (the reaper's cue), how often the reaper
    # stepped in, what a degraded retry changed, and when compensation ran (exactly once).
    deadline_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    recoveries: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    degraded: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    compensated_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Result cache (models.cache): set on jobs that compute; a cached job points at its source.
    cache_key: Mapped[str | None] = mapped_column(String(64), index=True)
    cached: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    source_job_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("jobs.id", ondelete="SET NULL"), index=True
    )
    # Usage (models.usage): what computing the job cost, written by the worker (a states.Charge
    # per attempt, in complete_* on success). GPU seconds add up over every attempt of a stage, retried
    # or failed ones included; a cached job or a follower computes nothing and keeps them null.
    text_gpu_s: Mapped[float | None] = mapped_column(Float)
    video_gpu_s: Mapped[float | None] = mapped_column(Float)
    text_model: Mapped[str | None] = mapped_column(String(255))  # the model the stage last ran on
    video_model: Mapped[str | None] = mapped_column(String(255))
    image_gpu_s: Mapped[float | None] = mapped_column(Float)
    image_model: Mapped[str | None] = mapped_column(String(255))
    # The model of each stage (models.catalog): {stage: {"asked": id}} from the submit (the named
    # or default one), and once the stage ran {"asked", "id", "version"} of what actually ran
    # (a degraded retry's fallback differs from the asked). Null on jobs from before this column.
    models: Mapped[dict[str, Any] | None] = mapped_column(JSONType)
    tokens_generated: Mapped[int | None] = mapped_column(Integer)  # the text stage's output tokens
    frames_rendered: Mapped[int | None] = mapped_column(Integer)  # the video stage's output frames
    images_rendered: Mapped[int | None] = mapped_column(Integer)  # the image stage's output images
    # Retention and deletion (models.retention): when the job's files, output text and prompt were
    # removed (expired, or DELETE /v1/jobs/{id}); the row stays, its usage columns intact.
    data_removed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    # Queue position (app.queue): the job's number in its priority's enqueue order, given by the
    # database on insert (migration 0009's trigger: a sequence per priority); null unless it was
    # inserted queued.
    queue_seq: Mapped[int | None] = mapped_column(BigInteger)
    # Output variants the job asked for beside its main file (tasks.variants): {name: {"status":
    # pending | ready | failed, "key", "bytes", "error"}}; null when it asked for none.
    variants: Mapped[dict[str, Any] | None] = mapped_column(JSONType)

    __table_args__ = (
        # Listing is newest first with an id tie-break; status filter uses the same order.
        Index("ix_jobs_created_id", "created_at", "id"),
        # Also the reaper's running jobs, whose deadlines it reads from the rows: deadline_at (and
        # stage, progress, attempts) stay unindexed, so a transition that changes only those is a
        # heap-only update that writes no index entry (migration 0016).
        Index("ix_jobs_status_created", "status", "created_at"),
        # A tenant's listing and its queued + running count (quota).
        Index("ix_jobs_tenant_created", "tenant_id", "created_at", "id"),
        Index("ix_jobs_tenant_status", "tenant_id", "status"),
        # Finished jobs by when (admission's throughput, the quota's recently finished, stalled
        # variants): a job joins it once, when it finishes (migration 0016).
        Index(
            "ix_jobs_finished_at",
            "completed_at",
            postgresql_where=text("completed_at IS NOT NULL"),
            sqlite_where=text("completed_at IS NOT NULL"),
        ),
        # The retention task's scan: finished jobs whose data is still there, oldest first.
        Index(
            "ix_jobs_retention",
            "completed_at",
            postgresql_where=text("data_removed_at IS NULL AND completed_at IS NOT NULL"),
        ),
        # Queue position (app.queue): each lane's queued computing jobs, their count and first and
        # last numbers read from this index alone.
        Index(
            "ix_jobs_queue_lane",
            "status",
            "priority",
            "queue_seq",
            postgresql_where=text("NOT cached"),
            sqlite_where=text("NOT cached"),
        ),
    )


class JobEvent(Base):
    """One row per state transition, written in the same transaction as the transition."""

    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(
        BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True
    )
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    type: Mapped[str] = mapped_column(String(64))
    from_status: Mapped[str | None] = mapped_column(String(16))
    to_status: Mapped[str | None] = mapped_column(String(16))
    stage: Mapped[str | None] = mapped_column(String(16))
    data: Mapped[dict[str, Any]] = mapped_column(JSONType, default=dict)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


@cache
def job_columns() -> list[tuple[str, str]]:
    """(attribute, column) pairs of Job, in the table's order; they differ for `meta` / "metadata"."""
    return [(prop.key, prop.columns[0].key) for prop in inspect(Job).column_attrs]
