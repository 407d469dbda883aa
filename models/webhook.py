"""Webhook tables: the outbox of job events, endpoints, deliveries with their attempt log, signing secrets.

Scope: endpoints and secrets belong to a tenant. A registered endpoint receives the events
of its tenant's jobs only, and every delivery is signed with the job's tenant's secrets.
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
    ColumnElement,
    ColumnExpressionArgument,
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
    "job.shot.completed",  # a storyboard's shot rendered (models.shot_states)
    "job.variant.completed",  # an output variant made or given up on, after job.succeeded (models.variants)
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
    """A receiver: registered for every job of its tenant (job_id NULL) or a job's own `webhook`."""

    __tablename__ = "webhook_endpoints"

    id: Mapped[uuid.UUID] = mapped_column(Uuid, primary_key=True, default=uuid.uuid4)
    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("tenants.id", ondelete="CASCADE"))
    job_id: Mapped[uuid.UUID | None] = mapped_column(
        Uuid, ForeignKey("jobs.id", ondelete="CASCADE"), unique=True
    )
    url: Mapped[str] = mapped_column(Text)
    events: Mapped[list[str] | None] = mapped_column(JSONType)  # None: the default set for its kind
    description: Mapped[str | None] = mapped_column(String(256))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    disabled_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    disabled_reason: Mapped[str | None] = mapped_column(String(64))

    # Every event of every job asks whether its tenant has a registered endpoint (job_id NULL):
    # one index probe, however many per-job endpoints the tenant has.
    __table_args__ = (Index("ix_webhook_endpoints_tenant_job", "tenant_id", "job_id"),)

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
    """A tenant's signing secrets by generation: the highest is current; an older one signs until expiry."""

    __tablename__ = "webhook_secrets"

    id: Mapped[int] = mapped_column(_BIGID, primary_key=True, autoincrement=True)
    tenant_id: Mapped[uuid.UUID] = mapped_column(Uuid, ForeignKey("tenants.id", ondelete="CASCADE"))
    generation: Mapped[int] = mapped_column(Integer)
    secret: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[datetime | None] = mapped_column(UTCDateTime)

    # The unique pair also makes concurrent first uses and rotations of one tenant collide.
    __table_args__ = (
        UniqueConstraint("tenant_id", "generation", name="uq_webhook_secrets_tenant_generation"),
    )

    def __repr__(self) -> str:  # never the secret itself
        return f"WebhookSecret(tenant_id={self.tenant_id}, generation={self.generation})"


def endpoints_for(job_id: uuid.UUID, tenant_id: uuid.UUID) -> Select[WebhookEndpoint]:
    """Live endpoints that may receive a job's events: its own, and every one its tenant registered."""
    return select(WebhookEndpoint).where(
        or_(
            WebhookEndpoint.job_id == job_id,
            (WebhookEndpoint.job_id.is_(None)) & (WebhookEndpoint.tenant_id == tenant_id),
        ),
        WebhookEndpoint.disabled_at.is_(None),
    )


def _registered(tenant_id: uuid.UUID | ColumnExpressionArgument[uuid.UUID]) -> Select[uuid.UUID]:
    return select(WebhookEndpoint.id).where(
        WebhookEndpoint.tenant_id == tenant_id,
        WebhookEndpoint.job_id.is_(None),
        WebhookEndpoint.disabled_at.is_(None),
    )


def any_registered_endpoint(session: Session, tenant_id: uuid.UUID) -> bool:
    return session.execute(_registered(tenant_id).limit(1)).first() is not None


def registered_endpoint_exists(tenant_id: ColumnExpressionArgument[uuid.UUID]) -> ColumnElement[bool]:
    """any_registered_endpoint as an EXISTS on a column, to ride along in a statement on that row."""
    return _registered(tenant_id).exists()


def new_secret() -> str:
    return "whsec_" + base64.b64encode(secrets.token_bytes(32)).decode()


def current_secret(session: Session, tenant_id: uuid.UUID) -> WebhookSecret:
    """The tenant's newest secret, created on first use (a concurrent first use loses and re-reads)."""
    stmt = (
        select(WebhookSecret)
        .where(WebhookSecret.tenant_id == tenant_id)
        .order_by(WebhookSecret.generation.desc())
        .limit(1)
    )
    found = session.scalars(stmt).first()
    if found is not None:
        return found
    try:
        with session.begin_nested():
            session.add(WebhookSecret(tenant_id=tenant_id, generation=1, secret=new_secret()))
    except IntegrityError:
        pass
    return session.scalars(stmt).one()


def signing_secrets(session: Session, tenant_id: uuid.UUID) -> list[str]:
    """The tenant's current secret first, then a superseded one still inside its rotation grace period."""
    now = utcnow()
    rows = session.scalars(
        select(WebhookSecret)
        .where(WebhookSecret.tenant_id == tenant_id)
        .where(or_(WebhookSecret.expires_at.is_(None), WebhookSecret.expires_at > now))
        .order_by(WebhookSecret.generation.desc())
        .limit(2)
    ).all()
    return [r.secret for r in rows] or [current_secret(session, tenant_id).secret]


def rotate_secret(
    session: Session, tenant_id: uuid.UUID, grace_s: float
) -> tuple[WebhookSecret, WebhookSecret]:
    """Make a new current secret for the tenant; the old one keeps signing for `grace_s`, any older stop now.

    Two concurrent rotations of one tenant collide on (tenant_id, generation): the loser raises
    IntegrityError.
    """
    old = current_secret(session, tenant_id)
    now = utcnow()
    session.execute(
        update(WebhookSecret)
        .where(WebhookSecret.tenant_id == tenant_id, WebhookSecret.generation < old.generation)
        .where(or_(WebhookSecret.expires_at.is_(None), WebhookSecret.expires_at > now))
        .values(expires_at=now)
    )
    old.expires_at = now + timedelta(seconds=grace_s)
    new = WebhookSecret(tenant_id=tenant_id, generation=old.generation + 1, secret=new_secret())
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
