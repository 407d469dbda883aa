"""Webhook tables: the outbox of job events, endpoints, deliveries with their attempt log, signing secrets.

Scope: endpoints and secrets belong to the deployment for now. Per-tenant scoping adds a
`tenant_id` column to `webhook_endpoints` and `webhook_secrets` (unique with `generation`)
and a filter in the query helpers at the bottom; nothing else depends on the scope.
"""

from __future__ import annotations

import base64
import secrets
import uuid
from datetime import datetime, timedelta
from enum import StrEnum
from typing import Any

from sqlalchemy import (
    BigInteger,
    ForeignKey,
    Index,
    Integer,
    Select,
    String,
    Text,
    UniqueConstraint,
    Uuid,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Mapped, Session, mapped_column, relationship, selectinload

from models.base import Base, JSONType, UTCDateTime, utcnow
from models.job import JobEvent

ALL_EVENTS = (
    "job.started",
    "job.text.completed",
    "job.progress",
    "job.succeeded",
    "job.failed",
    "job.canceled",
)
TERMINAL_EVENTS = ("job.succeeded", "job.failed", "job.canceled")


class DeliveryStatus(StrEnum):
    PENDING = "pending"  # waiting for its (next) attempt
    DELIVERED = "delivered"  # a 2xx came back
    FAILED = "failed"  # retries exhausted, or a response that retrying cannot fix
    DISABLED = "disabled"  # the endpoint was disabled (410 Gone, or deleted) before it went out


_BIGID = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements INTEGER keys only


class WebhookMessage(Base):
    """Outbox row: written with its job event, in the same transaction, when anyone may want it."""

    __tablename__ = "webhook_messages"

    id: Mapped[int] = mapped_column(
        _BIGID, ForeignKey("job_events.id", ondelete="CASCADE"), primary_key=True, autoincrement=False
    )
    uid: Mapped[uuid.UUID] = mapped_column(Uuid, default=uuid.uuid4, unique=True)  # webhook-id
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    type: Mapped[str] = mapped_column(String(64))
    snapshot: Mapped[dict[str, Any]] = mapped_column(JSONType)  # the job row as the event left it
    body: Mapped[str | None] = mapped_column(Text)  # rendered once, so every attempt sends the same bytes
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    fanned_out_at: Mapped[datetime | None] = mapped_column(UTCDateTime, index=True)

    event: Mapped[JobEvent] = relationship()

    @property
    def webhook_id(self) -> str:
        return f"msg_{self.uid.hex}"


class WebhookEndpoint(Base):
    """A receiver: registered for every job (job_id NULL) or a job's own `webhook` (job_id set)."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("jobs.id", ondelete="CASCADE"), unique=True
    )
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str] | None] = mapped_column(JSONType)  # None: the default set for its kind
    description: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    disabled_reason: Mapped[str | None] = mapped_column(String(64))

    def wants(self, event_type: str) -> bool:
        default = TERMINAL_EVENTS if self.job_id is not None else ALL_EVENTS
        return event_type in (self.events or default)


class WebhookDelivery(Base):
    """One message to one endpoint; `attempts` log every try."""

    __tablename__ = "webhook_deliveries"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    message_id: Mapped[int] = mapped_column(_BIGID, ForeignKey("webhook_messages.id", ondelete="CASCADE"))
    endpoint_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("webhook_endpoints.id", ondelete="CASCADE"), index=True
    )
    job_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("jobs.id", ondelete="CASCADE"), index=True)
    event_type: Mapped[str] = mapped_column(String(64))
    status: Mapped[str] = mapped_column(String(16), default=DeliveryStatus.PENDING)
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    schedule_step: Mapped[int] = mapped_column(Integer, default=0)  # position in the retry schedule
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    delivered_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    message: Mapped[WebhookMessage] = relationship()
    endpoint: Mapped[WebhookEndpoint] = relationship()
    log: Mapped[list[WebhookAttempt]] = relationship(
        order_by="WebhookAttempt.number", cascade="all, delete-orphan", passive_deletes=True
    )

    __table_args__ = (
        UniqueConstraint("message_id", "endpoint_id", name="uq_webhook_deliveries_message_endpoint"),
        # The relay's query: pending work that is due.
        Index("ix_webhook_deliveries_status_next", "status", "next_attempt_at"),
    )


class WebhookAttempt(Base):
    """One HTTP try of a delivery: what came back, how long it took, when the next one is due."""

    __tablename__ = "webhook_attempts"

    id: Mapped[int] = mapped_column(_BIGID, primary_key=True, autoincrement=True)
    delivery_id: Mapped[uuid.UUID] = mapped_column(
        Uuid, ForeignKey("webhook_deliveries.id", ondelete="CASCADE"), index=True
    )
    number: Mapped[int] = mapped_column(Integer)
    started_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    duration_ms: Mapped[int] = mapped_column(Integer)
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    response_excerpt: Mapped[str | None] = mapped_column(Text)
    next_attempt_at: Mapped[datetime | None] = mapped_column(UTCDateTime)


class WebhookSecret(Base):
    """Signing secrets by generation: the highest is current; a superseded one signs until expires_at."""

    __tablename__ = "webhook_secrets"

    id: Mapped[int] = mapped_column(_BIGID, primary_key=True, autoincrement=True)
    generation: Mapped[int] = mapped_column(Integer, unique=True)
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    def __repr__(self) -> str:  # never the secret itself
        return f"WebhookSecret(generation={self.generation})"


def endpoints_for(job_id: uuid.UUID) -> Select[tuple[WebhookEndpoint]]:
    """Live endpoints that may receive a job's events: its own, and every registered one."""
    return select(WebhookEndpoint).where(
        or_(WebhookEndpoint.job_id == job_id, WebhookEndpoint.job_id.is_(None)),
        WebhookEndpoint.disabled_at.is_(None),
    )


def any_registered_endpoint(session: Session) -> bool:
    stmt = select(WebhookEndpoint.id).where(
        WebhookEndpoint.job_id.is_(None), WebhookEndpoint.disabled_at.is_(None)
    )
    return session.execute(stmt.limit(1)).first() is not None


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def current_secret(session: Session) -> WebhookSecret:
    """The newest secret, created on first use (a concurrent first use loses the race and re-reads)."""
    stmt = select(WebhookSecret).order_by(WebhookSecret.generation.desc()).limit(1)
    found = session.scalars(stmt).first()
    if found is not None:
        return found
    try:
        with session.begin_nested():
            session.add(WebhookSecret(generation=1, secret=new_secret()))
    except IntegrityError:
        pass
    return session.scalars(stmt).one()


def signing_secrets(session: Session) -> list[str]:
    """The current secret first, then a superseded one still inside its rotation grace period."""
    now = utcnow()
    rows = session.scalars(
        select(WebhookSecret)
        .where(or_(WebhookSecret.expires_at.is_(None), WebhookSecret.expires_at > now))
        .order_by(WebhookSecret.generation.desc())
        .limit(2)
    ).all()
    return [r.secret for r in rows] or [current_secret(session).secret]


def rotate_secret(session: Session, grace_s: float) -> tuple[WebhookSecret, WebhookSecret]:
    """Make a new current secret; the old one keeps signing for `grace_s`, any older stop now.

    Two concurrent rotations collide on the unique generation: the loser raises IntegrityError.
    """
    old = current_secret(session)
    now = utcnow()
    session.execute(
        update(WebhookSecret)
        .where(WebhookSecret.generation < old.generation)
        .where(or_(WebhookSecret.expires_at.is_(None), WebhookSecret.expires_at > now))
        .values(expires_at=now)
    )
    old.expires_at = now + timedelta(seconds=grace_s)
    new = WebhookSecret(generation=old.generation + 1, secret=new_secret())
    session.add(new)
    session.flush()
    return new, old


def requeue(delivery: WebhookDelivery) -> None:
    """Queue a delivery again from the start of the retry schedule (its attempt log is kept)."""
    delivery.status = DeliveryStatus.PENDING
    delivery.schedule_step = 0
    delivery.next_attempt_at = utcnow()
    delivery.last_error = None


def job_deliveries(session: Session, job_id: uuid.UUID) -> list[WebhookDelivery]:
    """A job's deliveries in event order, each with its endpoint and attempt log."""
    stmt = (
        select(WebhookDelivery)
        .where(WebhookDelivery.job_id == job_id)
        .options(
            selectinload(WebhookDelivery.log),
            selectinload(WebhookDelivery.endpoint),
            selectinload(WebhookDelivery.message).load_only(WebhookMessage.uid),
        )
        .order_by(WebhookDelivery.message_id, WebhookDelivery.created_at)
    )
    return list(session.scalars(stmt))
