"""Webhook delivery (docs/WEBHOOKS.md)."""

from __future__ import annotations

from pydantic import BaseModel, Field


class WebhookSettings(BaseModel):
    """Fields of models.settings.Settings (GENQUEUE_<FIELD>)."""

    # -- webhooks (docs/WEBHOOKS.md)
    webhook_allow_private: bool = Field(
        False, description="Allow webhook targets on private and loopback addresses (development, tests)."
    )
    webhook_timeout_s: float = Field(10.0, description="Timeout of one webhook delivery attempt.")
    webhook_retry_schedule_s: list[float] = Field(
        [5, 300, 1800, 7200, 18000, 36000, 86400],
        description="JSON list: the delay before each retry of a failed delivery.",
    )
    webhook_max_response_bytes: int = Field(4096, description="Most of a response body that is read.")
    webhook_progress_interval_s: float = Field(
        2.0, description="Least time between two `job.progress` events of a job."
    )
    webhook_secret_grace_s: float = Field(
        24 * 3600, description="How long the old secret keeps signing after a rotation."
    )
    webhook_relay_interval_s: float = Field(
        10.0, description="How often the relay looks for deliveries a crash left behind."
    )
    webhook_relay_grace_s: float = Field(
        30.0, description="How overdue a delivery must be before the relay steps in."
    )
