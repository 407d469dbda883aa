"""Webhook delivery tasks: a per-job dispatcher (fan-out, ordered sends, retries) and the periodic relay.

One dispatcher at a time per job (a Postgres advisory lock; a process-local lock on
SQLite) sends that job's messages in event order; to each endpoint a message goes
out only after the one before it was delivered or given up on. Retries are rows with
a due time: the run that scheduled one publishes its wake-up, and the relay finds
anything overdue (a dispatch lost to a crash, a broker outage, a long backoff).
"""

from __future__ import annotations

import functools
import json
import logging
import random
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Any

from celery import Task, shared_task
from sqlalchemy import select, text, update
from sqlalchemy.orm import Session, sessionmaker

from models import plans
from models.base import utcnow
from models.db import transaction
from models.job import Job
from models.outbox import job_from_snapshot
from models.resource import job_resource
from models.settings import Settings
from models.webhook import (
    DeliveryStatus,
    WebhookAttempt,
    WebhookDelivery,
    WebhookEndpoint,
    WebhookMessage,
    endpoints_for,
    signing_secrets,
)
from tasks import webhook_send
from tasks.contract import names
from tasks.contract.publish import publish_dispatch
from tasks.metrics import metrics, webhook_overdue_jobs
from tasks.runtime import Runtime, runtime
from tasks.webhook_send import Outcome, Verdict

log = logging.getLogger("genqueue.webhooks")

LOCK_RETRIES = 20  # a busy job lock is retried this often (0.3-1 s apart), then left to the relay
MAX_WAKE_S = 3600  # longer backoffs are left to the relay: Redis redelivers ETA messages past visibility
_LOCK_NS = 0x67717768  # "gqwh": keeps our advisory lock keys apart from anyone else's
_local_held: set[uuid.UUID] = set()
_local_guard = threading.Lock()


@contextmanager
def job_lock(rt: Runtime, job_id: uuid.UUID) -> Iterator[sessionmaker[Session] | None]:
    """Sessions that hold the job's dispatcher lock, or None when another dispatcher holds it.

    Postgres: a session-level advisory lock on a connection this run keeps, so a worker
    that dies releases it with its connection. No transaction stays open across a POST.
    """
    if rt.engine.dialect.name != "postgresql":
        with _local_guard:
            held = job_id not in _local_held
            _local_held.add(job_id)
        try:
            yield rt.sessions if held else None
        finally:
            if held:
                with _local_guard:
                    _local_held.discard(job_id)
        return
    key = _lock_args(job_id)
    with rt.engine.connect() as conn:
        held = bool(conn.execute(text("SELECT pg_try_advisory_lock(:ns, :k)"), key).scalar())
        conn.commit()
        if not held:
            yield None
            return
        try:
            yield sessionmaker(bind=conn, expire_on_commit=False)
        finally:
            conn.rollback()
            conn.execute(text("SELECT pg_advisory_unlock(:ns, :k)"), key)
            conn.commit()


def _lock_args(job_id: uuid.UUID) -> dict[str, int]:
    # The two-int4 form: (our namespace, 31 bits of the job id). A collision only serializes two jobs.
    return {"ns": _LOCK_NS, "k": job_id.int & 0x7FFFFFFF}


def render(message: WebhookMessage, base_url: str, retention_s: int | None = None) -> str:
    """The payload {type, id, timestamp, data}; data is the job resource as the event left it.

    A `job.shot.completed` payload also says which shot (`shot`): the resource leaves a
    storyboard's shots out of webhook payloads, and the event is about one of them. A
    `job.variant.completed` payload says which variant (`variant`: name, status, pending); the
    resource's `variants` has its links.
    """
    payload: dict[str, Any] = {
        "type": message.type,
        "id": message.webhook_id,
        "timestamp": message.created_at.isoformat().replace("+00:00", "Z"),
        "data": job_resource(job_from_snapshot(message.snapshot), base_url, retention_s=retention_s),
    }
    if message.type == "job.shot.completed":
        payload["shot"] = _shot(message.event.data or {}, f"{base_url}/v1/jobs/{message.job_id}/content")
    elif message.type == "job.variant.completed":
        data = message.event.data or {}
        payload["variant"] = {
            "name": data.get("variant"),
            "status": data.get("status"),
            "variants_pending": data.get("variants_pending"),
        }
    return json.dumps(payload, separators=(",", ":"), ensure_ascii=False)


def _shot(data: dict[str, Any], content: str) -> dict[str, Any]:
    """The completed shot, from its event's data (models.shot_states.complete)."""
    index = int(data.get("shot", 0))
    return {
        "index": index,
        "shots_completed": data.get("shots_completed"),
        "shots": data.get("shots"),
        "cached": bool(data.get("cached", False)),
        "video_url": f"{content}?variant=shot&index={index}",
    }


def _job_endpoint(s: Session, job_id: uuid.UUID, tenant_id: uuid.UUID, snapshot: dict[str, object]) -> None:
    """The job's own `webhook` becomes an endpoint row on first use (so 410 can disable it)."""
    hook = snapshot.get("webhook")
    if not isinstance(hook, dict) or not hook.get("url"):
        return
    if s.scalar(select(WebhookEndpoint.id).where(WebhookEndpoint.job_id == job_id)) is None:
        s.add(WebhookEndpoint(job_id=job_id, tenant_id=tenant_id, url=hook["url"], events=hook.get("events")))
        s.flush()


def _tenant_of(s: Session, job_id: uuid.UUID) -> uuid.UUID | None:
    """The job's tenant: whose endpoints receive its events and whose secrets sign them."""
    return s.scalar(select(Job.tenant_id).where(Job.id == job_id))


def fan_out(sessions: sessionmaker[Session], settings: Settings, job_id: uuid.UUID) -> int:
    """Turn the job's new outbox messages into one delivery per interested endpoint."""
    with transaction(sessions) as s:
        messages = s.scalars(
            select(WebhookMessage)
            .where(WebhookMessage.job_id == job_id, WebhookMessage.fanned_out_at.is_(None))
            .order_by(WebhookMessage.id)
        ).all()
        tenant_id = _tenant_of(s, job_id)
        if not messages or tenant_id is None:  # None: the job (and so its messages) was deleted
            return 0
        _job_endpoint(s, job_id, tenant_id, messages[-1].snapshot)
        endpoints = s.scalars(endpoints_for(job_id, tenant_id)).all()
        now, base, made = utcnow(), settings.public_base_url.rstrip("/"), 0
        retention_s = plans.for_tenant(s, settings, tenant_id).retention_s  # expires_at as the API says it
        for msg in messages:
            msg.body, msg.fanned_out_at = render(msg, base, retention_s), now
            for ep in endpoints:
                if ep.wants(msg.type):
                    s.add(
                        WebhookDelivery(
                            message_id=msg.id,
                            endpoint_id=ep.id,
                            job_id=job_id,
                            event_type=msg.type,
                            status=DeliveryStatus.PENDING,
                            next_attempt_at=now,
                            attempts=0,
                            schedule_step=0,
                        )
                    )
                    made += 1
        return made


def _next_due(s: Session, job_id: uuid.UUID, now: datetime) -> WebhookDelivery | None:
    """The earliest message that is due and heads its endpoint's queue (nothing older still pending)."""
    pending = s.scalars(
        select(WebhookDelivery)
        .where(WebhookDelivery.job_id == job_id, WebhookDelivery.status == DeliveryStatus.PENDING)
        .order_by(WebhookDelivery.message_id)
    ).all()
    seen: set[uuid.UUID] = set()
    for d in pending:
        if d.endpoint_id in seen:
            continue
        seen.add(d.endpoint_id)
        if d.next_attempt_at is None or d.next_attempt_at <= now:
            return d
    return None


def _record(
    s: Session, settings: Settings, d: WebhookDelivery, out: Outcome, started: datetime
) -> datetime | None:
    """Store the attempt and its consequence; returns the retry time if one was scheduled."""
    now = utcnow()
    d.attempts += 1
    d.last_status_code, d.last_error = out.status_code, out.error
    retry_at = None
    if out.verdict == Verdict.DELIVERED:
        d.status, d.delivered_at, d.next_attempt_at = DeliveryStatus.DELIVERED, now, None
    elif out.verdict == Verdict.RETRY:
        delay = webhook_send.next_delay(settings.webhook_retry_schedule_s, d.schedule_step, out.retry_after_s)
        if delay is None:
            d.status, d.next_attempt_at = DeliveryStatus.FAILED, None
            d.last_error = f"gave up after {d.attempts} attempts: {out.error or out.status_code}"
        else:
            retry_at = now + timedelta(seconds=delay)
            d.schedule_step += 1
            d.next_attempt_at = retry_at
            # Later messages to this endpoint queue behind this one: same due time, so the
            # relay does not wake for them while the head waits.
            s.execute(
                update(WebhookDelivery)
                .where(
                    WebhookDelivery.job_id == d.job_id,
                    WebhookDelivery.endpoint_id == d.endpoint_id,
                    WebhookDelivery.status == DeliveryStatus.PENDING,
                    WebhookDelivery.message_id > d.message_id,
                )
                .values(next_attempt_at=retry_at)
            )
    else:
        d.status, d.next_attempt_at = DeliveryStatus.FAILED, None
        if out.verdict == Verdict.GONE:
            d.last_error = "410 Gone: endpoint disabled"
            _disable(s, d.endpoint_id, "gone", now)
    s.add(
        WebhookAttempt(
            delivery_id=d.id,
            number=d.attempts,
            started_at=started,
            duration_ms=out.duration_ms,
            status_code=out.status_code,
            error=out.error,
            response_excerpt=out.excerpt,
            next_attempt_at=retry_at,
        )
    )
    return retry_at


def _withdraw(s: Session, d: WebhookDelivery) -> None:
    """Nothing was sent, so no attempt is logged; a delivery the disable missed is closed here."""
    if d.status == DeliveryStatus.PENDING:
        d.status, d.next_attempt_at, d.last_error = DeliveryStatus.DISABLED, None, "endpoint disabled"


def _disable(s: Session, endpoint_id: uuid.UUID, reason: str, now: datetime) -> None:
    s.execute(
        update(WebhookEndpoint)
        .where(WebhookEndpoint.id == endpoint_id, WebhookEndpoint.disabled_at.is_(None))
        .values(disabled_at=now, disabled_reason=reason)
    )
    s.execute(
        update(WebhookDelivery)
        .where(WebhookDelivery.endpoint_id == endpoint_id, WebhookDelivery.status == DeliveryStatus.PENDING)
        .values(status=DeliveryStatus.DISABLED, next_attempt_at=None, last_error=f"endpoint {reason}")
        .execution_options(synchronize_session=False)
    )


def still_pending(sessions: sessionmaker[Session], delivery_id: uuid.UUID) -> bool:
    """Whether the delivery may still go out: pending, to an endpoint nobody disabled (one PK probe).

    A 410 from another job's delivery disables the endpoint in its own transaction, while
    this run may already have read the delivery: asked again right before the connection.
    """
    with sessions() as s:
        row = s.execute(
            select(WebhookDelivery.status, WebhookEndpoint.disabled_at)
            .join(WebhookEndpoint, WebhookEndpoint.id == WebhookDelivery.endpoint_id)
            .where(WebhookDelivery.id == delivery_id)
        ).first()
    return row is not None and row.status == DeliveryStatus.PENDING and row.disabled_at is None


def send_due(sessions: sessionmaker[Session], settings: Settings, job_id: uuid.UUID) -> datetime | None:
    """Send every due message of the job in order; returns the earliest retry this run scheduled."""
    wake: datetime | None = None
    with webhook_send.make_client(settings) as client:
        while True:
            with transaction(sessions) as s:
                d = _next_due(s, job_id, utcnow())
                tenant_id = _tenant_of(s, job_id)
                if d is None or tenant_id is None:
                    return wake
                s.refresh(d, ["endpoint", "message"])
                if d.message.body is None:  # scrubbed: the job's data was removed (models.retention)
                    retention_s = plans.for_tenant(s, settings, tenant_id).retention_s
                    d.message.body = render(d.message, settings.public_base_url.rstrip("/"), retention_s)
                delivery_id, url = d.id, d.endpoint.url
                msg_id, body = d.message.webhook_id, d.message.body or ""
                secrets = signing_secrets(s, tenant_id)
            started = utcnow()
            headers = webhook_send.signed_headers(secrets, msg_id, body)
            out = webhook_send.post(
                client, settings, url, body, headers, functools.partial(still_pending, sessions, delivery_id)
            )
            with transaction(sessions) as s:
                d = s.get(WebhookDelivery, delivery_id, populate_existing=True)
                if d is None:  # the job was deleted meanwhile
                    continue
                if out.verdict == Verdict.WITHDRAWN:
                    _withdraw(s, d)
                    log.info("webhook %s %s withdrawn: endpoint disabled", msg_id, d.event_type)
                    continue
                retry_at = _record(s, settings, d, out, started)
            exhausted = out.verdict == Verdict.RETRY and retry_at is None  # no retry left: given up
            metrics().webhook_attempts.labels("exhausted" if exhausted else out.verdict).inc()
            if retry_at is not None:
                wake = retry_at if wake is None else min(wake, retry_at)
            log.info(
                "webhook %s %s -> %s (%s) in %d ms",
                msg_id,
                d.event_type,
                out.status_code or out.error,
                out.verdict,
                out.duration_ms,
            )


@shared_task(bind=True, name=names.DELIVER_WEBHOOK, max_retries=LOCK_RETRIES)
def deliver_webhooks(self: Task[[str], None], job_id: str) -> None:
    """Fan out and send one job's pending webhook messages, in order."""
    rt = runtime(self.app)
    jid = uuid.UUID(job_id)
    with job_lock(rt, jid) as sessions:
        if sessions is None:
            # Another run holds the job; it may finish before seeing our message, so look again soon.
            if self.request.retries < LOCK_RETRIES:
                raise self.retry(countdown=random.uniform(0.3, 1.0))
            return
        fan_out(sessions, rt.settings, jid)
        wake = send_due(sessions, rt.settings, jid)
    if wake is not None:
        delay = max(0.0, (wake - utcnow()).total_seconds())
        if delay <= MAX_WAKE_S:
            publish_dispatch(self.app, [jid], countdown=delay)


def overdue_jobs(sessions: sessionmaker[Session], grace_s: float, limit: int = 1000) -> list[uuid.UUID]:
    """Jobs with outbox messages nobody fanned out, or deliveries overdue by more than `grace_s`."""
    cutoff = utcnow() - timedelta(seconds=grace_s)
    with sessions() as s:
        unsent = select(WebhookMessage.job_id).where(
            WebhookMessage.fanned_out_at.is_(None), WebhookMessage.created_at <= cutoff
        )
        due = select(WebhookDelivery.job_id).where(
            WebhookDelivery.status == DeliveryStatus.PENDING, WebhookDelivery.next_attempt_at <= cutoff
        )
        return list(s.scalars(unsent.union(due).limit(limit)))


@shared_task(bind=True, name=names.RELAY_WEBHOOKS)
def relay_webhooks(self: Task[[], int]) -> int:
    """Beat: wake a dispatcher for every job whose webhooks fell behind."""
    rt = runtime(self.app)
    jobs = overdue_jobs(rt.sessions, rt.settings.webhook_relay_grace_s)
    webhook_overdue_jobs().set(len(jobs))
    if jobs:
        log.info("relay: waking webhook dispatch for %d jobs", len(jobs))
        publish_dispatch(self.app, jobs)
    return len(jobs)
