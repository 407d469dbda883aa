"""Runtime settings read from the environment, shared by the web front and the workers."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Every knob in one place. Env names: GENQUEUE_<FIELD>, plus DATABASE_URL and BROKER_URL."""

    model_config = SettingsConfigDict(env_prefix="GENQUEUE_", extra="ignore")

    database_url: str = Field(
        "postgresql+psycopg://postgres@127.0.0.1:5432/genqueue",
        validation_alias=AliasChoices("DATABASE_URL", "GENQUEUE_DATABASE_URL"),
    )
    broker_url: str = Field(
        "redis://127.0.0.1:6379/0", validation_alias=AliasChoices("BROKER_URL", "GENQUEUE_BROKER_URL")
    )
    artifact_dir: Path = Path("var/artifacts")
    public_base_url: str = ""  # e.g. https://genqueue.example.com; empty: relative URLs

    text_model: str = "smollm2"  # registered name or a local transformers directory
    video_model: str = "wan-tiny"  # registered name or a local diffusers directory
    # auto: bf16 on CUDA, float32 on CPU; bfloat16 on an AMX CPU batches faster (docs/BENCHMARKS.md).
    text_dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    worker_preload: str = ""  # "text", "video" or "text,video": load at worker start, not first task

    db_pool_size: int = 10
    db_max_overflow: int = 10
    db_connect_timeout_s: int = 3
    # The API pings no connection before use (a round trip saved per checkout, 2-3 per request):
    # after a Postgres restart each web process answers one request 503 and then reconnects.
    # Workers test a connection before use when it sat idle or its server hung up on it
    # (models.liveness): a failed statement there would cost a task retry.
    db_web_pre_ping: bool = False
    broker_visibility_timeout_s: int = 7200
    # Task events (a Redis PUBLISH per task received, started, succeeded) cost the worker's main
    # process about as much as fetching the tasks. Off unless asked for: Flower switches them on
    # in every worker it sees (its --enable_events, on by default) for as long as it runs.
    worker_task_events: bool = False

    text_soft_time_limit_s: int = 300
    text_time_limit_s: int = 360
    video_soft_time_limit_s: int = 1800
    video_time_limit_s: int = 1900
    max_retries: int = 3
    retry_backoff_s: float = 2.0
    retry_backoff_max_s: float = 300.0
    progress_interval_s: float = 0.5
    # Reliability (docs/RELIABILITY.md): retries of infrastructure errors, stage attempts,
    # the reaper's deadlines, degraded retries and idempotency keys.
    max_stage_attempts: int = 6  # deliveries of one stage (retries + redeliveries) before it fails
    infra_max_retries: int = 20  # database/broker errors inside a task: retried this often
    infra_backoff_s: float = 1.0
    infra_backoff_max_s: float = 30.0
    broker_restore_interval_s: int = 10  # Redis: how often unacked messages past the timeout return
    broker_closed_transport_guard: bool = Field(
        True,
        description="Patch kombu's Redis transport so a channel of a closed connection raises a connection "
        "error instead of AttributeError: the crash that made a worker exit on a Redis restart "
        "(tasks.kombu_fixes). Off only to reproduce that crash.",
    )
    worker_restart_backoff_s: float = Field(
        1.0, description="`genqueue worker`: first wait before restarting a worker that exited unexpectedly."
    )
    worker_restart_backoff_max_s: float = Field(
        30.0, description="`genqueue worker`: the restart wait doubles per quick exit up to this."
    )
    stage_grace_s: int = 120  # past a stage's hard time limit before the reaper calls it stuck
    publish_grace_s: int = 60  # committed but unpublished (or failed but uncompensated) this long
    queued_timeout_s: int = 6 * 3600  # waiting this long for a worker: published again
    max_recoveries: int = 3  # reaper interventions per job before it fails the job
    reaper_interval_s: float = 30.0
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
    degrade_steps_factor: float = 0.5
    degrade_size_factor: float = 0.5
    degraded_video_model: str = ""  # a cheaper model for degraded retries; empty: the same model
    idempotency_ttl_s: int = 24 * 3600

    # Webhooks (docs/WEBHOOKS.md). Private targets are for development and tests only.
    webhook_allow_private: bool = False
    webhook_timeout_s: float = 10.0
    webhook_retry_schedule_s: list[float] = [5, 300, 1800, 7200, 18000, 36000, 86400]
    webhook_max_response_bytes: int = 4096
    webhook_progress_interval_s: float = 2.0
    webhook_secret_grace_s: float = 24 * 3600
    webhook_relay_interval_s: float = 10.0
    webhook_relay_grace_s: float = 30.0  # how overdue work must be before the relay steps in

    # Dynamic batching (tasks.batching): concurrent stage executions in one worker share a call.
    text_batch_max_size: int = 8  # 1 turns text batching off
    text_batch_max_wait_ms: float = 200.0  # a lone job waits a quarter of it
    video_batch_max_size: int = 4  # same-shaped video requests only
    video_batch_max_wait_ms: float = 200.0

    # Result cache (models.cache): identical seeded requests reuse a finished or running job.
    cache_enabled: bool = True
    cache_version: str = "1"  # bump to invalidate every cached result (e.g. new weights, same name)
    queue_position_ttl_s: float = 1.0  # how long a process reuses its queued-jobs counts
    max_wait_s: int = 30  # upper bound of `Prefer: wait=N` on submit
    max_waiters: int = 4  # concurrent `Prefer: wait` requests per web process; more answer at once

    max_body_bytes: int = 64 * 1024
    web_body_timeout_s: float = Field(
        10.0,
        description="Seconds a client has to send a request's whole body once its headers are in; "
        "slower uploads get 408 and the connection closes (the gevent web worker, app/server.py). "
        "The request line and headers have the gunicorn keepalive (5 s) to arrive.",
    )
    max_json_depth: int = Field(
        32,
        ge=1,
        le=500,  # the JSON decoder recurses once per level: far below Python's recursion limit
        description="Deepest nesting of arrays and objects a request body may have (the API's own "
        "bodies need 3); deeper bodies get 400 before they are decoded.",
    )
    prompt_max_chars: int = 4000
    default_width: int = 256
    default_height: int = 256
    default_num_frames: int = 17
    default_fps: int = 8
    default_steps: int = 8
    default_max_new_tokens: int = 64

    # Tenancy, rate limits and admission control (docs/API.md). The default plan: every
    # tenant gets these unless `genqueue tenants plan` overrides them for it.
    ratelimit_url: str = ""  # empty: the broker if it is Redis, else redis://127.0.0.1:6379/0
    # sliding-window-counter: two counters per limit, O(1) in Redis; moving-window keeps every hit
    # of the window in a list and scans it for each answer's headers (O(limit) per request).
    ratelimit_strategy: str = "sliding-window-counter"
    # How long a web process trusts a key it has looked up: a revoked key (or a changed plan)
    # takes effect within this many seconds; 0 looks every key up on every request.
    auth_cache_s: float = 5.0
    plan_rate_limit: str = "100/second;3000/minute"  # per API key: a burst and a sustained rate
    plan_max_active_jobs: int = 1000  # per tenant: queued + running
    plan_max_width: int = 1024
    plan_max_height: int = 1024
    plan_max_frames: int = 121
    plan_max_steps: int = 100
    plan_max_priority: str = "high"
    plan_max_prompt_chars: int = 4000
    admission_max_text_backlog: int = 10000  # jobs waiting for the text stage (queued)
    admission_max_video_backlog: int = 10000  # video jobs not finished yet
    admission_max_wait_s: float = 0.0  # estimated wait bound; 0 turns it off
    admission_cache_s: float = 1.0  # how long one process reuses a backlog measurement

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")

    @property
    def ratelimit_storage_uri(self) -> str:
        """Where rate-limit counters and quota reservations live, shared by every web process."""
        if self.ratelimit_url:
            return self.ratelimit_url
        if self.broker_url.startswith(("redis://", "rediss://")):
            return self.broker_url
        return "redis://127.0.0.1:6379/0"
