"""The `job_shots` table: one row per shot of a storyboard job, rendered in parallel, then stitched."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum

from sqlalchemy import BigInteger, Float, ForeignKey, Integer, String, Text, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, UTCDateTime, utcnow

MIN_SHOTS, MAX_SHOTS = 2, 12  # a storyboard's shots (params.shots)


class ShotStatus(StrEnum):
    QUEUED = "queued"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class JobShot(Base):
    """A storyboard shot: its description from the text stage, its render's state and file."""

    __tablename__ = "job_shots"

    job_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("jobs.id", ondelete="CASCADE"), primary_key=True
    )
    idx: Mapped[int] = mapped_column(Integer, primary_key=True)  # 0-based order in the film
    status: Mapped[str] = mapped_column(String(16), default=ShotStatus.QUEUED)
    description: Mapped[str] = mapped_column(Text)
    progress: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    attempts: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    artifact_path: Mapped[str | None] = mapped_column(String(1024))
    artifact_bytes: Mapped[int | None] = mapped_column(BigInteger)
    frames: Mapped[int | None] = mapped_column(Integer)
    seconds: Mapped[float | None] = mapped_column(Float)  # the last attempt's render time
    gpu_s: Mapped[float | None] = mapped_column(Float)  # every attempt's GPU share, added up
    # The shot cache (models.shot_cache): its key, set when it renders for a cache-eligible job,
    # and the job whose identical shot it copied instead (no FK: that job may be deleted first).
    cache_key: Mapped[str | None] = mapped_column(String(64), index=True)
    source_job_id: Mapped[uuid.UUID | None] = mapped_column(Uuid)
    error_code: Mapped[str | None] = mapped_column(String(64))
    error_message: Mapped[str | None] = mapped_column(Text)
    started_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    completed_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow, onupdate=utcnow)
