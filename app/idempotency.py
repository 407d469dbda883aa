"""Idempotency-Key on POST /v1/jobs(/batch): a repeat returns the original job(s); another body, 422."""

from __future__ import annotations

import hashlib
import json
import uuid
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from flask import request
from sqlalchemy import delete, select
from sqlalchemy.orm import Session, sessionmaker

from app.errors import ValidationFailed
from models import IdempotencyKey, Job
from models.base import utcnow

HEADER = "Idempotency-Key"
MAX_LENGTH = 255


def _invalid(message: str) -> ValidationFailed:
    errors = [{"field": HEADER, "message": message}]
    return ValidationFailed(f"The {HEADER} header is invalid.", errors=errors)


def body_hash(body: Any) -> str:
    """sha256 of the body as canonical JSON: key order and whitespace do not matter."""
    canonical = json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


@dataclass(frozen=True)
class Idempotency:
    key: str  # scoped_key(tenant, client key)
    digest: str

    def _row(self, session: Session) -> IdempotencyKey | None:
        """The unexpired use of this key; 422 if that request had another body."""
        row = session.get(IdempotencyKey, self.key)
        if row is None or row.expires_at <= utcnow():
            return None
        if row.request_hash != self.digest:
            raise _invalid("this key was used with a different request body")
        return row

    def prior(self, sessions: sessionmaker[Session]) -> Job | None:
        """The job an unexpired use of this key created; 422 if that request had another body."""
        with sessions() as s:
            row = self._row(s)
            return s.get(Job, row.job_id) if row is not None else None

    def prior_batch(self, sessions: sessionmaker[Session]) -> list[Job] | None:
        """The jobs a batch submit with this key created, in order (see prior)."""
        with sessions() as s:
            row = self._row(s)
            if row is None:
                return None
            ids = [uuid.UUID(j) for j in row.job_ids or [str(row.job_id)]]
            found = {j.id: j for j in s.scalars(select(Job).where(Job.id.in_(ids)))}
            return [found[j] for j in ids if j in found]

    def claim(self, session: Session, job_ids: list[uuid.UUID], ttl_s: int, batch: bool = False) -> None:
        """Record the key for the job (a batch: its jobs, in order) in the jobs' own transaction.

        The key is the primary key: of concurrent requests exactly one INSERT commits, the
        others fail with IntegrityError at flush (Postgres makes them wait for the first).
        """
        now = utcnow()
        session.execute(
            delete(IdempotencyKey).where(IdempotencyKey.key == self.key, IdempotencyKey.expires_at <= now)
        )
        session.add(
            IdempotencyKey(
                key=self.key,
                request_hash=self.digest,
                job_id=job_ids[0],
                job_ids=[str(j) for j in job_ids] if batch else None,
                created_at=now,
                expires_at=now + timedelta(seconds=ttl_s),
            )
        )
        session.flush()


def from_request(body: Any, tenant_id: uuid.UUID) -> Idempotency | None:
    """The request's Idempotency-Key (None without one); 422 naming the header if malformed."""
    key = request.headers.get(HEADER)
    if key is None:
        return None
    if not key or len(key) > MAX_LENGTH:
        raise _invalid(f"must be 1 to {MAX_LENGTH} characters")
    if not key.isascii() or not key.isprintable():
        raise _invalid("must be printable ASCII")
    return Idempotency(scoped_key(tenant_id, key), body_hash(body))


def scoped_key(tenant_id: uuid.UUID, key: str) -> str:
    """What is stored for a client's key: one tenant's key never finds another tenant's job."""
    return hashlib.sha256(f"{tenant_id}\x00{key}".encode()).hexdigest()
