"""Stages, retries and recovery (docs/RELIABILITY.md): time limits, backoff, the reaper, retention."""

from __future__ import annotations

from pydantic import BaseModel, Field


class ReliabilitySettings(BaseModel):
    """Fields of models.settings.Settings (GENQUEUE_<FIELD>)."""

    # -- stages, retries and recovery (docs/RELIABILITY.md)
    text_soft_time_limit_s: int = Field(300, description="Text task soft time limit (raised in the task).")
    text_time_limit_s: int = Field(
        360,
        description="Text task hard time limit: prefork kills the task; a threads worker whose generate() "
        "call outlives it restarts itself (tasks/hang_guard.py).",
    )
    video_soft_time_limit_s: int = Field(1800, description="Video task soft time limit.")
    video_time_limit_s: int = Field(1900, description="Video task hard time limit (as the text one).")
    image_soft_time_limit_s: int = Field(600, description="Image task soft time limit.")
    image_time_limit_s: int = Field(660, description="Image task hard time limit (as the text one).")
    max_retries: int = Field(3, description="Retries of a transient (model) failure per stage.")
    retry_backoff_s: float = Field(2.0, description="First retry countdown; doubles per attempt.")
    retry_backoff_max_s: float = Field(300.0, description="Upper bound of the retry countdown.")
    progress_interval_s: float = Field(
        0.5, description="Least time between two progress writes (and cancel checks) of a running stage."
    )
    max_stage_attempts: int = Field(
        6, description="Deliveries of one stage (retries + redeliveries) before the job fails."
    )
    infra_max_retries: int = Field(
        20, description="Database/broker errors inside a task are retried this often."
    )
    infra_backoff_s: float = Field(1.0, description="First countdown of an infrastructure-error retry.")
    infra_backoff_max_s: float = Field(30.0, description="Upper bound of the infrastructure-error countdown.")
    stage_grace_s: int = Field(
        120, description="Time past a stage's hard time limit before the reaper calls it stuck."
    )
    publish_grace_s: int = Field(
        60,
        description="A job committed but unpublished (or failed but uncompensated) this long is "
        "handled by the reaper.",
    )
    queued_timeout_s: int = Field(
        6 * 3600, description="A job waiting this long for a worker is published again."
    )
    max_recoveries: int = Field(3, description="Reaper interventions per job before it fails the job.")
    reaper_interval_s: float = Field(30.0, description="How often the reaper (beat) runs.")
    retention_s: int = Field(
        7 * 24 * 3600,
        ge=0,
        description="How long a finished job's outputs are kept: its `expires_at` is `completed_at` plus "
        "this; then the retention task removes its files, output text and prompt (the row stays for "
        "usage). 0 keeps them forever. Changing it moves `expires_at` of every finished job. The "
        "default plan's: a tenant's plan may set its own `retention_s`, shorter or longer.",
    )
    retention_interval_s: float = Field(
        300.0, gt=0, description="How often the retention task (beat) removes expired jobs' data."
    )
    retention_batch: int = Field(
        100, ge=1, description="Expired jobs the retention task removes per run: a backlog drains over runs."
    )
    lost_message_after_s: int = Field(
        120,
        description=(
            "A job waiting this long for a stage whose message is in neither the stage's queue "
            "lists nor the broker's unacked set (a Redis consumer killed between taking it and "
            "recording it) is published again: lost messages are recovered within this plus "
            "reaper_interval_s. An unacked message held this long by a consumer that never "
            "started it counts as lost too. Redis brokers only (RabbitMQ's delivery is atomic)."
        ),
    )
    degrade_steps_factor: float = Field(
        0.5, description="`allow_degraded` retries: the video's steps are multiplied by this."
    )
    degrade_size_factor: float = Field(
        0.5, description="`allow_degraded` retries: the video's width and height are multiplied by this."
    )
    degraded_video_model: str = Field(
        "", description="A cheaper video model for degraded retries; empty: the same model."
    )
    degraded_image_model: str = Field(
        "", description="A cheaper image model for degraded retries; empty: the same model."
    )
    idempotency_ttl_s: int = Field(24 * 3600, description="How long an `Idempotency-Key` is remembered.")
