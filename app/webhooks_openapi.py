"""The webhook part of /openapi.json: response models and the operations of app.webhooks."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.openapi_parts import json_answer, op, param, problems, ref
from app.webhook_schemas import EndpointCreate, EventType


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class WebhookEndpoint(_Doc):
    id: str
    object: Literal["webhook_endpoint"]
    url: str
    events: list[EventType]
    description: str | None
    job_id: str | None = Field(description="Set for a job's own webhook; null for registered endpoints.")
    created_at: str
    disabled_at: str | None
    disabled_reason: str | None = Field(description="`gone` after a 410 response, `deleted`.")


class WebhookEndpointList(_Doc):
    data: list[WebhookEndpoint]


class WebhookSecret(_Doc):
    object: Literal["webhook_secret"]
    secret: str = Field(description="`whsec_<base64>`: verify signatures with any Standard Webhooks library.")
    created_at: str
    previous_secret_active: bool = Field(description="The previous secret still signs (rotation grace).")
    previous_expires_at: str | None = Field(None, description="Rotation only: when the old secret stops.")


class WebhookAttempt(_Doc):
    number: int
    started_at: str
    duration_ms: int
    status_code: int | None
    error: str | None
    response_excerpt: str | None
    next_attempt_at: str | None


class WebhookEndpointRef(_Doc):
    id: str
    url: str


class WebhookDelivery(_Doc):
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


class WebhookDeliveryList(_Doc):
    data: list[WebhookDelivery]


MODELS: list[type[BaseModel]] = [
    WebhookEndpoint,
    WebhookEndpointList,
    WebhookSecret,
    WebhookDelivery,
    WebhookDeliveryList,
]
REQUESTS: list[type[BaseModel]] = [EndpointCreate]


def paths() -> dict[str, Any]:

    job_id = param("job_id", "path", {"type": "string", "format": "uuid"})
    endpoint_id = param("endpoint_id", "path", {"type": "string", "format": "uuid"})
    delivery_id = param("delivery_id", "path", {"type": "string", "format": "uuid"})
    create = op(
        "createWebhookEndpoint",
        "Register an endpoint for every job's events",
        {
            "201": json_answer("WebhookEndpoint", "Registered", {"Location": {"schema": {"type": "string"}}}),
            **problems(400, 413, 415, 422),
        },
    )
    create["responses"]["201"]["links"] = {
        "DeleteWebhookEndpoint": {
            "operationId": "deleteWebhookEndpoint",
            "parameters": {"endpoint_id": "$response.body#/id"},
        }
    }
    create["requestBody"] = {
        "required": True,
        "content": {"application/json": {"schema": ref("EndpointCreate")}},
    }
    return {
        "/v1/webhooks": {
            "post": create,
            "get": op(
                "listWebhookEndpoints",
                "List the caller's endpoints",
                {"200": json_answer("WebhookEndpointList", "")},
            ),
        },
        "/v1/webhooks/{endpoint_id}": {
            "delete": op(
                "deleteWebhookEndpoint",
                "Delete an endpoint",
                {"204": {"description": "Deleted"}, **problems(404)},
                endpoint_id,
            )
        },
        "/v1/webhooks/secret": {
            "get": op(
                "getWebhookSecret",
                "The caller's signing secret",
                {"200": json_answer("WebhookSecret", "")},
            )
        },
        "/v1/webhooks/secret/rotate": {
            "post": op(
                "rotateWebhookSecret",
                "Rotate the caller's signing secret (both sign during the grace period)",
                {"200": json_answer("WebhookSecret", "The new secret"), **problems(409)},
            )
        },
        "/v1/jobs/{job_id}/webhook-deliveries": {
            "get": op(
                "listWebhookDeliveries",
                "A job's webhook deliveries and every attempt",
                {"200": json_answer("WebhookDeliveryList", ""), **problems(404)},
                job_id,
            )
        },
        "/v1/webhook-deliveries/{delivery_id}/redeliver": {
            "post": op(
                "redeliverWebhook",
                "Send a delivery again",
                {"202": json_answer("WebhookDelivery", "Queued"), **problems(404, 409)},
                delivery_id,
            )
        },
    }
