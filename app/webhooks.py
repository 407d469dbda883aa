"""Webhook endpoints of the API: registered endpoints, the signing secret, a job's delivery log, replays."""

from __future__ import annotations

import logging
import uuid
from typing import Any

from flask import Blueprint, Response, jsonify
from pydantic import ValidationError
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError

from app.auth import owned, tenant_id
from app.body import json_body
from app.errors import Conflict, NotFound, ValidationFailed
from app.job_access import load_job
from app.schemas import field_errors
from app.services import services
from app.webhook_resources import (
    delivery_list,
    delivery_resource,
    endpoint_list,
    endpoint_resource,
    secret_resource,
)
from app.webhook_schemas import EndpointCreate
from models import Job
from models.base import utcnow
from models.db import transaction
from models.webhook import (
    DeliveryStatus,
    WebhookDelivery,
    WebhookEndpoint,
    current_secret,
    job_deliveries,
    requeue,
    rotate_secret,
    signing_secrets,
)
from tasks.contract.publish import publish_dispatch
from tasks.contract.transient import TRANSIENT_ERRORS

log = logging.getLogger("genqueue.api")
bp = Blueprint("webhooks", __name__, url_prefix="/v1")
NO_STORE = {"Cache-Control": "no-store"}


def _uuid(raw: str, what: str) -> uuid.UUID:
    try:
        return uuid.UUID(raw)
    except ValueError:
        raise NotFound(f"No {what} with id {raw!r}.") from None


@bp.post("/webhooks")
def create_endpoint() -> tuple[Response, int, dict[str, str]]:
    svc = services()
    body = json_body()
    try:
        req = EndpointCreate.model_validate(body, context={"settings": svc.settings})
    except ValidationError as exc:
        raise ValidationFailed("The webhook endpoint is invalid.", errors=field_errors(exc, body)) from None
    ep = WebhookEndpoint(
        id=uuid.uuid4(), tenant_id=tenant_id(), url=req.url, events=req.events, description=req.description
    )
    with transaction(svc.sessions) as s:
        s.add(ep)
    return jsonify(endpoint_resource(ep)), 201, {"Location": f"/v1/webhooks/{ep.id}"}


def _registered() -> Any:
    # The caller's registered endpoints only: a job's own webhook is managed through the job.
    stmt = select(WebhookEndpoint).where(
        WebhookEndpoint.job_id.is_(None),
        (WebhookEndpoint.disabled_reason.is_(None)) | (WebhookEndpoint.disabled_reason != "deleted"),
    )
    return owned(stmt, WebhookEndpoint)


@bp.get("/webhooks")
def list_endpoints() -> Response:
    with services().sessions() as s:
        rows = s.scalars(_registered().order_by(WebhookEndpoint.created_at)).all()
        return jsonify(endpoint_list(list(rows)))


# A uuid converter, not a plain segment: `/webhooks/secret` must not match this rule too (the
# automatic OPTIONS answer and 405's Allow list the methods of every rule the path matches).
@bp.delete("/webhooks/<uuid:endpoint_id>")
def delete_endpoint(endpoint_id: uuid.UUID) -> tuple[str, int]:
    """Soft delete: the endpoint stops receiving, its delivery log stays readable."""
    eid = endpoint_id
    with transaction(services().sessions) as s:
        ep = s.scalars(_registered().where(WebhookEndpoint.id == eid)).first()
        if ep is None:
            raise NotFound(f"No webhook endpoint with id '{endpoint_id}'.")
        now = utcnow()
        ep.disabled_at, ep.disabled_reason = ep.disabled_at or now, "deleted"
        for d in s.scalars(
            select(WebhookDelivery).where(
                WebhookDelivery.endpoint_id == eid, WebhookDelivery.status == DeliveryStatus.PENDING
            )
        ):
            d.status, d.next_attempt_at, d.last_error = DeliveryStatus.DISABLED, None, "endpoint deleted"
    return "", 204


def _secret_resource(s: Any, rotated_from: Any = None) -> dict[str, Any]:
    """The caller's secret; after a rotation (`rotated_from`: the old one) when that one stops."""
    cur = current_secret(s, tenant_id())
    previous = [x for x in signing_secrets(s, tenant_id()) if x != cur.secret]
    if rotated_from is None:
        return secret_resource(cur.secret, cur.created_at, bool(previous))
    return secret_resource(cur.secret, cur.created_at, bool(previous), True, rotated_from.expires_at)


@bp.get("/webhooks/secret")
def get_secret() -> tuple[Response, int, dict[str, str]]:
    with transaction(services().sessions) as s:  # a transaction: the first read creates it
        body = _secret_resource(s)
    return jsonify(body), 200, NO_STORE


@bp.post("/webhooks/secret/rotate")
def rotate() -> tuple[Response, int, dict[str, str]]:
    """A new secret signs from now on; the old one also signs until the grace period ends."""
    svc = services()
    try:
        with transaction(svc.sessions) as s:
            _, old = rotate_secret(s, tenant_id(), svc.settings.webhook_secret_grace_s)
            body = _secret_resource(s, rotated_from=old)
    except IntegrityError:
        raise Conflict("Another rotation happened at the same time; read the secret again.") from None
    return jsonify(body), 200, NO_STORE


@bp.get("/jobs/<job_id>/webhook-deliveries")
def list_deliveries(job_id: str) -> Response:
    with services().sessions() as s:
        job = load_job(s, job_id)
        return jsonify(delivery_list(list(job_deliveries(s, job.id))))


@bp.post("/webhook-deliveries/<delivery_id>/redeliver")
def redeliver(delivery_id: str) -> tuple[Response, int]:
    """Replay one delivery (same webhook-id, so receivers can tell it is a replay)."""
    svc = services()
    did = _uuid(delivery_id, "webhook delivery")
    with transaction(svc.sessions) as s:
        # Through its job: another tenant's delivery is as absent as a missing one.
        stmt = select(WebhookDelivery).join(Job, Job.id == WebhookDelivery.job_id)
        d = s.scalar(owned(stmt.where(WebhookDelivery.id == did)))
        if d is None:
            raise NotFound(f"No webhook delivery with id {delivery_id!r}.")
        if d.endpoint.disabled_at is not None:
            raise Conflict(
                f"The endpoint is disabled ({d.endpoint.disabled_reason}); nothing was sent.",
                extra={"endpoint_id": str(d.endpoint_id)},
            )
        requeue(d)
        job_id = d.job_id
    try:
        publish_dispatch(svc.celery, [job_id])
    except TRANSIENT_ERRORS as exc:
        log.warning("redelivery of %s queued; dispatch not published (the relay will send it): %s", did, exc)
    with svc.sessions() as s:
        found = [x for x in job_deliveries(s, job_id) if x.id == did]
        if not found:
            raise NotFound(f"No webhook delivery with id {delivery_id!r}.")
        return jsonify(delivery_resource(found[0])), 202
