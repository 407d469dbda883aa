"""Verify a webhook delivery: the server signs with Standard Webhooks, so its library checks it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from standardwebhooks import Webhook
from standardwebhooks.webhooks import WebhookVerificationError

from genqueue_client.errors import GenqueueError


class InvalidSignature(GenqueueError):
    """The delivery was not signed with this secret, was altered, or is too old or too new."""


def verify_webhook(secret: str, body: bytes | str, headers: Mapping[str, str]) -> dict[str, Any]:
    """The event (`type`, `id`, `timestamp`, `data`: the job resource) of a genuine delivery.

    `secret` is `GET /v1/webhooks/secret`'s `whsec_...`; `body` the raw request body, before any
    JSON parsing; `headers` the request's (webhook-id, webhook-timestamp, webhook-signature, in
    any case). Raises InvalidSignature otherwise. Deliveries are at-least-once: dedupe on the
    event's `id` (the webhook-id header).
    """
    try:
        event = Webhook(secret).verify(body, {k.lower(): v for k, v in headers.items()})
    except WebhookVerificationError as exc:
        raise InvalidSignature(str(exc)) from exc
    if not isinstance(event, dict):
        raise InvalidSignature("the body is not a JSON object")
    return event
