"""Webhook request models: a job's `webhook` and a registered endpoint, the URL checked against SSRF."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator
from pydantic_core import PydanticCustomError

from app.body import StorableStr
from models import ssrf

# models.webhook.ALL_EVENTS as a type (tests/test_webhook* checks they name the same events).
EventType = Literal[
    "job.started",
    "job.text.completed",
    "job.progress",
    "job.shot.completed",
    "job.variant.completed",
    "job.succeeded",
    "job.failed",
    "job.canceled",
]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


def _checked_url(url: str, info: ValidationInfo) -> str:
    """http(s) only, resolving to public addresses only (unless the deployment allows private ones)."""
    settings = (info.context or {}).get("settings")
    try:
        if settings is None:
            ssrf.split_url(url)  # no settings (schema generation): syntax only
        else:
            ssrf.check_url(url, allow_private=settings.webhook_allow_private)
    except ssrf.UnsafeURL as exc:
        raise PydanticCustomError("unsafe_url", "{reason}", {"reason": str(exc)}) from None
    return url


def _distinct(events: list[str] | None) -> list[str] | None:
    return list(dict.fromkeys(events)) if events is not None else None


class WebhookSubscription(_Strict):
    """A job's own webhook: its events go to `url`, signed with its tenant's secret."""

    url: StorableStr = Field(
        min_length=1, max_length=ssrf.MAX_URL_CHARS, description="http(s) URL, public address."
    )
    events: list[EventType] | None = Field(
        None, min_length=1, description="Default: the terminal events (succeeded, failed, canceled)."
    )

    _url = field_validator("url")(_checked_url)
    _events = field_validator("events")(_distinct)


class EndpointCreate(_Strict):
    """A registered endpoint: receives events of every job."""

    url: StorableStr = Field(
        min_length=1, max_length=ssrf.MAX_URL_CHARS, description="http(s) URL, public address."
    )
    events: list[EventType] | None = Field(None, min_length=1, description="Default: every event type.")
    description: StorableStr | None = Field(None, max_length=256, description="No control characters.")

    _url = field_validator("url")(_checked_url)
    _events = field_validator("events")(_distinct)
