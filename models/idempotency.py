"""The `idempotency_keys` table: one row per Idempotency-Key, naming the job (or jobs) it created."""

from __future__ import annotations

import uuid
from datetime import datetime

from sqlalchemy import ForeignKey, Index, String, Uuid
from sqlalchemy.orm import Mapped, mapped_column

from models.base import Base, JSONType, UTCDateTime, utcnow


class IdempotencyKey(Base):
    """The primary key is the client's key: a second INSERT of it fails, so no read-then-write race."""

    __tablename__ = "idempotency_keys"

    key: Mapped[str] = mapped_column(String(255), primary_key=True)
    request_hash: Mapped[str] = mapped_column(String(64))  # sha256 of the canonical JSON body
    # Deleting the job (e.g. it could not be published) frees the key for a retry.
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    # A batch submit (POST /v1/jobs/batch): every job id it created, in order; job_id is the first.
    # A batch's jobs are withdrawn together, so the first one's CASCADE frees the key for them all.
    job_ids: Mapped[list[str] | None] = mapped_column(JSONType)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime] = mapped_column(UTCDateTime)

    __table_args__ = (Index("ix_idempotency_keys_expires_at", "expires_at"),)
