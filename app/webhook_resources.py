"""The webhook resources: their pydantic models (the /openapi.json schemas) and their serializers."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import Field

from app.webhook_schemas import EventType
from models.resource import Resource, iso
from models.webhook import ALL_EVENTS, TERMINAL_EVENTS
from models.webhook import WebhookDelivery as DeliveryRow
from models.webhook import WebhookEndpoint as EndpointRow


class WebhookEndpoint(Resource):
    id: str
    object: Literal["webhook_endpoint"]
    url: str
    events: list[EventType]
    description: str | None
    job_id: str | None = Field(description="Set for a job's own webhook; null for registered endpoints.")
    created_at: str
    disabled_at: str | None
    disabled_reason: str | None = Field(description="`gone` after a 410 response, `deleted`.")


class WebhookEndpointList(Resource):
    data: list[WebhookEndpoint]


class WebhookSecret(Resource):
    object: Literal["webhook_secret"]
    secret: str = Field(description="`whsec_<base64>`: verify signatures with any Standard Webhooks library.")
    created_at: str
    previous_secret_active: bool = Field(description="The previous secret still signs (rotation grace).")
    previous_expires_at: str | None = Field(None, description="Rotation only: when the old secret stops.")


class WebhookAttempt(Resource):
    number: int
    started_at: str
    duration_ms: int
    status_code: int | None
    error: str | None
    response_excerpt: str | None
    next_attempt_at: str | None


class WebhookEndpointRef(Resource):
    id: str
    url: str


class WebhookDelivery(Resource):
    id: str
    object: Literal["webhook_delivery"]
    job_id: str
    event_type: EventType
    webhook_id: str = Field(description="The `webhook-id` header: the same on every attempt and replay.")
    endpoint: WebhookEndpointRef
    status: Literal["pending", "delivered", "failed", "disabled"]
    attempts: int
    next_attempt_at: str | None
    last_status_code: int | None
    last_error: str | None
    created_at: str
    delivered_at: str | None
    attempt_log: list[WebhookAttempt]


class WebhookDeliveryList(Resource):
    data: list[WebhookDelivery]


MODELS: list[type[Resource]] = [
    WebhookEndpoint,
    WebhookEndpointList,
    WebhookSecret,
    WebhookDelivery,
    WebhookDeliveryList,
]


def _endpoint(ep: EndpointRow) -> WebhookEndpoint:
    default = TERMINAL_EVENTS if ep.job_id is not None else ALL_EVENTS
    return WebhookEndpoint(
        id=str(ep.id),
        object="webhook_endpoint",
        url=ep.url,
        events=list(ep.events or default),
        description=ep.description,
        job_id=str(ep.job_id) if ep.job_id else None,
        created_at=iso(ep.created_at) or "",
        disabled_at=iso(ep.disabled_at),
        disabled_reason=ep.disabled_reason,
    )


def endpoint_resource(ep: EndpointRow) -> dict[str, Any]:
    return _endpoint(ep).public()


def endpoint_list(rows: list[EndpointRow]) -> dict[str, Any]:
    return WebhookEndpointList(data=[_endpoint(ep) for ep in rows]).public()


def _delivery(d: DeliveryRow) -> WebhookDelivery:
    return WebhookDelivery(
        id=str(d.id),
        object="webhook_delivery",
        job_id=str(d.job_id),
        event_type=d.event_type,
        webhook_id=d.message.webhook_id,
        endpoint=WebhookEndpointRef(id=str(d.endpoint_id), url=d.endpoint.url),
        status=d.status,
        attempts=d.attempts,
        next_attempt_at=iso(d.next_attempt_at),
        last_status_code=d.last_status_code,
        last_error=d.last_error,
        created_at=iso(d.created_at) or "",
        delivered_at=iso(d.delivered_at),
        attempt_log=[
            WebhookAttempt(
                number=a.number,
                started_at=iso(a.started_at) or "",
                duration_ms=a.duration_ms,
                status_code=a.status_code,
                error=a.error,
                response_excerpt=a.response_excerpt,
                next_attempt_at=iso(a.next_attempt_at),
            )
            for a in d.log
        ],
    )


def delivery_resource(d: DeliveryRow) -> dict[str, Any]:
    return _delivery(d).public()


def delivery_list(rows: list[DeliveryRow]) -> dict[str, Any]:
    return WebhookDeliveryList(data=[_delivery(d) for d in rows]).public()


def secret_resource(
    secret: str,
    created_at: datetime,
    previous_active: bool,
    rotated: bool = False,
    previous_expires_at: datetime | None = None,
) -> dict[str, Any]:
    """The signing secret; `previous_expires_at` only in the answer to a rotation."""
    extra = {"previous_expires_at": iso(previous_expires_at)} if rotated else {}
    return WebhookSecret(
        object="webhook_secret",
        secret=secret,
        created_at=iso(created_at) or "",
        previous_secret_active=previous_active,
        **extra,
    ).public()
