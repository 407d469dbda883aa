"""The webhook part of /openapi.json: the operations of app.webhooks (models: app.webhook_resources)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from app.openapi_parts import json_answer, op, param, problems, ref
from app.webhook_schemas import EndpointCreate

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
