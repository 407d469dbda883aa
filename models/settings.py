"""Runtime settings read from the environment, shared by the web front and the workers."""

from __future__ import annotations

import functools
import os
from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

# docs/SETTINGS.md is generated from the fields below (python -m models.settings_doc), grouped by
# models.settings_doc.GROUPS; tests/test_settings_doc.py fails when it is stale or a field has no
# description.


class Settings(BaseSettings):
    """Every knob in one place. Env names: GENQUEUE_<FIELD>, plus DATABASE_URL and BROKER_URL."""

    model_config = SettingsConfigDict(env_prefix="GENQUEUE_", extra="ignore")

    # -- services and storage
    database_url: str = Field(
        "postgresql+psycopg://postgres@127.0.0.1:5432/genqueue",
        validation_alias=AliasChoices("DATABASE_URL", "GENQUEUE_DATABASE_URL"),
        description="The database (PostgreSQL through psycopg 3); `sqlite:///path` for one process "
        "(the embedded mode).",
    )
    broker_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("BROKER_URL", "GENQUEUE_BROKER_URL"),
        description="The Celery broker: Redis, or RabbitMQ (`amqp://guest:guest@127.0.0.1:5672//`).",
    )
    artifact_dir: Path = Field(
        Path("var/artifacts"),
        description="Where MP4s and thumbnails are written; shared by the web processes and the video "
        "workers.",
    )
    public_base_url: str = Field(
        "",
        description="The API's public origin (e.g. `https://genqueue.example.com`) for absolute links; "
        "empty: relative URLs.",
    )
    media_url_keys: SecretStr | None = Field(
        None,
        description="Comma-separated keys that sign the links to job outputs (`outputs.*_signed_url`, "
        "`/v1/media/...`): the first signs, every one verifies (rotation: put the new key first, drop "
        "the old one after `media_url_ttl_s`). Every web process must have the same keys. Unset: jobs "
        "carry no signed links.",
    )
    media_url_ttl_s: int = Field(
        3600,
        ge=60,
        le=7 * 24 * 3600,
        description="How long a signed link stays valid (a link is valid this long, less up to a tenth "
        "of it, at most 300 s: links issued together share an expiry, so caches see one URL).",
    )
    cors_origins: list[str] = Field(
        [],
        description='JSON list of origins (e.g. `["https://app.example.com"]`, `["*"]` for any) '
        "allowed to call the API and load media from a browser page (CORS); empty: none.",
    )
    model_cache: Path = Field(
        Path("~/.cache/genqueue/models"),
        description="Where the dequantized SmolLM2 weights and the API's prompt tokenizer "
        "(`prompt-limit/`) are cached; `~` is expanded.",
    )

    # -- models and workers
    text_model: str = Field(
        "smollm2",
        description="`smollm2`, `echo` (zero cost), a registered name, or a local transformers "
        "causal-LM directory.",
    )
    video_model: str = Field(
        "wan-tiny",
        description="`wan-tiny`, `echo` (zero cost), a registered name, or a local diffusers "
        "text-to-video directory.",
    )
    text_dtype: Literal["auto", "float32", "bfloat16", "float16"] = Field(
        "auto",
        description="The text model's dtype: `auto`, `float32`, `bfloat16` or `float16`. `auto`: "
        "bfloat16 on CUDA, float32 on CPU; bfloat16 on an AMX CPU runs batched text ~1.3x faster "
        "(docs/BENCHMARKS.md), but its rounding lets a row's greedy text depend on its batch-mates.",
    )
    extra_models: str = Field(
        "",
        description="More models a job may name (`model`), beside the built-ins: comma-separated "
        "`stage:id=spec`, spec a local model directory or a `module:Class` adapter, e.g. "
        "`text:tinyllama=/models/tinyllama`.",
    )
    model_swaps: str = Field(
        "",
        description="Model ids pointed at other weights, like `extra_models` (`stage:id=spec`, "
        "comma-separated); `genqueue models swap` adds to these at run time, for every process within "
        "a second, without a restart.",
    )
    worker_max_models: int = Field(
        2,
        ge=1,
        description="Models of one stage a worker process keeps loaded; loading one more unloads the "
        "least recently used.",
    )
    model_heartbeat_s: float = Field(
        10.0,
        gt=0,
        description="How often a worker process re-announces its loaded models in Redis (the `warm` of "
        "GET /v1/models); an announcement lapses after 3x this.",
    )
    worker_preload: str = Field(
        "",
        description="`text`, `video` or `text,video`: load those models when the worker process starts, "
        "not at its first task.",
    )
    echo_step_seconds: float = Field(
        0.0,
        description="The `echo` video adapter sleeps this long per step, so tests can catch a task "
        "mid-run; read when each batch runs.",
    )
    worker_task_events: bool = Field(
        False,
        description="Send Celery task events always. Off, Flower (in the Procfile) switches them on "
        "in every worker it sees while it runs.",
    )
    # Why off: task events (a Redis PUBLISH per task received, started, succeeded) cost the
    # worker's main process about as much as fetching the tasks.
    worker_restart_backoff_s: float = Field(
        1.0,
        description="`genqueue worker` and `genqueue start`: first wait before restarting a worker (or a "
        "Procfile process) that exited unexpectedly.",
    )
    worker_restart_backoff_max_s: float = Field(
        30.0,
        description="`genqueue worker`, `genqueue start`: the restart wait doubles per quick exit to this.",
    )
    worker_metrics_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the worker's own Prometheus endpoint (`/metrics`), served by its main "
        "process for all its pool processes; 0: off. One port per worker on a host: the Procfile "
        "gives each worker line its own (docs/OPERATIONS.md).",
    )
    worker_metrics_address: str = Field(
        "127.0.0.1",
        description="The address the worker metrics endpoint listens on; `0.0.0.0` for a Prometheus "
        "on another host.",
    )
    worker_metrics_dir: Path = Field(
        Path("var/worker-metrics"),
        description="Where a worker with a metrics port keeps its pool processes' metric files: "
        "`<dir>/<port>`, emptied when the worker starts.",
    )

    # -- database
    db_pool_size: int = Field(
        10,
        description="Pooled database connections per web process (a request holds one only while its "
        "statements run; the others wait for one).",
    )
    db_max_overflow: int = Field(10, description="Connections a web process may open beyond the pool.")
    worker_db_pool_size: int = Field(4, description="Pooled database connections per worker process.")
    worker_db_max_overflow: int = Field(
        4, description="Connections a worker process may open beyond its pool."
    )
    db_connect_timeout_s: int = Field(3, description="Seconds to wait for a new database connection.")
    db_web_pre_ping: bool = Field(
        False,
        description="`true`: the API tests each pooled connection before use. Off, each web process "
        "answers one request 503 after a Postgres restart, then reconnects.",
    )
    # Why off: a round trip saved per checkout, 2-3 per request. Workers test a connection before
    # use when it sat idle or its server hung up on it (models.liveness): a failed statement there
    # would cost a task retry.

    # -- broker
    broker_visibility_timeout_s: int = Field(
        7200,
        description="Redis: an unacked message returns to its queue after this; keep it above the "
        "longest time limit plus retry countdown.",
    )
    broker_restore_interval_s: int = Field(
        10, description="Redis: how often unacked messages past the visibility timeout are restored."
    )
    broker_socket_timeout_s: float = Field(
        10.0,
        description="RabbitMQ: a blocking read or write on a broker connection gives up after this "
        "many seconds, and a worker reconnects instead of waiting for the heartbeat timeout "
        "(a consumer once sat 90 s in a `basic_qos` read on a desynchronised AMQP stream). "
        "0 waits forever.",
        ge=0,
    )
    broker_closed_transport_guard: bool = Field(
        True,
        description="Patch kombu's Redis transport so a channel of a closed connection raises a connection "
        "error instead of AttributeError: the crash that made a worker exit on a Redis restart "
        "(tasks.kombu_fixes). Off only to reproduce that crash.",
    )

    # -- stages, retries and recovery (docs/RELIABILITY.md)
    text_soft_time_limit_s: int = Field(300, description="Text task soft time limit (raised in the task).")
    text_time_limit_s: int = Field(360, description="Text task hard time limit (the pool kills the task).")
    video_soft_time_limit_s: int = Field(1800, description="Video task soft time limit.")
    video_time_limit_s: int = Field(1900, description="Video task hard time limit.")
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
        "usage). 0 keeps them forever. Changing it moves `expires_at` of every finished job.",
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
    idempotency_ttl_s: int = Field(24 * 3600, description="How long an `Idempotency-Key` is remembered.")

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

    # -- dynamic batching (tasks.batching): concurrent stage executions in one worker share a call
    text_batch_max_size: int = Field(8, description="Most text jobs in one model call; 1 turns batching off.")
    text_batch_max_wait_ms: float = Field(
        200.0, description="Longest a text job waits for batch-mates (a lone job waits a quarter of it)."
    )
    video_batch_max_size: int = Field(4, description="Most same-shaped video requests in one model call.")
    video_batch_max_wait_ms: float = Field(200.0, description="Longest a video job waits for batch-mates.")

    # -- result cache (models.cache) and waiting
    cache_enabled: bool = Field(
        True, description="Identical seeded requests reuse a finished or running job's result."
    )
    cache_version: str = Field(
        "1", description="Bump to invalidate every cached result (e.g. new weights under the same name)."
    )
    queue_position_ttl_s: float = Field(
        1.0, description="How long a web process reuses its queued-jobs counts (`queue_position`)."
    )
    max_wait_s: int = Field(30, description="Upper bound of `Prefer: wait=N` on submit.")
    max_waiters: int = Field(
        4, description="Concurrent `Prefer: wait` requests per web process; more answer at once."
    )

    # -- job event streams (GET /v1/jobs/{id}/events)
    stream_max_per_process: int = Field(
        1000, description="Concurrent event streams per web process; past it a new stream gets 503."
    )
    stream_max_per_tenant: int = Field(
        100, description="Concurrent event streams of one tenant per web process; past it 429."
    )
    stream_heartbeat_s: float = Field(
        15.0, description="Seconds of silence after which a stream sends a comment line (keeps proxies open)."
    )
    stream_poll_s: float = Field(
        2.0,
        description="How often a stream re-reads its job's events when no notification listener is "
        "connected (SQLite, or Postgres unreachable); also the listener's reconnect pause.",
    )
    stream_max_duration_s: float = Field(
        3600.0,
        description="A stream closes after this long (the client resumes with `Last-Event-ID`), so a "
        "restarting web process is never held up by old streams.",
    )

    # -- request limits and job defaults
    max_body_bytes: int = Field(64 * 1024, description="Largest request body; larger ones get 413.")
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
    prompt_max_chars: int = Field(4000, description="Longest prompt in characters, after normalisation.")
    default_width: int = Field(256, description="Video width when a job does not say.")
    default_height: int = Field(256, description="Video height when a job does not say.")
    default_num_frames: int = Field(17, description="Video frames when a job does not say.")
    default_fps: int = Field(8, description="Video frames per second when a job does not say.")
    default_steps: int = Field(8, description="Diffusion steps when a job does not say.")
    default_max_new_tokens: int = Field(64, description="Text tokens generated when a job does not say.")
    # Small models loop at temperature 0 ("it is a new beginning" eight times); these keep the
    # text stage's output readable. Both count only the tokens a job generated, never its prompt.
    text_repetition_penalty: float = Field(
        1.2,
        ge=1.0,
        description="Text stage: divide the scores of tokens a job has already generated by this "
        "(CTRL-style; 1.0 turns it off). Higher: less repetition, but also fewer legitimate repeats.",
    )
    text_no_repeat_ngram_size: int = Field(
        4,
        ge=0,
        description="Text stage: never generate the same run of this many tokens twice in one job's text "
        "(0 turns it off). Lower is stricter.",
    )

    # -- tenancy, rate limits and admission control (docs/API.md); the default plan: every
    # tenant gets these unless `genqueue tenants plan` overrides them for it
    ratelimit_url: str = Field(
        "",
        description="Redis for rate limits and quotas, shared by every web process; empty: the broker "
        "if it is Redis, else `redis://127.0.0.1:6379/0`.",
    )
    ratelimit_strategy: str = Field(
        "sliding-window-counter",
        description="`sliding-window-counter` (two counters per limit, O(1) in Redis) or `moving-window` "
        "(every hit of the window kept and scanned: O(limit) per request).",
    )
    auth_cache_s: float = Field(
        5.0,
        description="How long a web process trusts a key it has looked up: a revoked key (or a changed "
        "plan) takes effect within this; `0` looks every key up on every request.",
    )
    plan_rate_limit: str = Field(
        "100/second;3000/minute",
        description="Default plan: requests per API key (a burst and a sustained rate).",
    )
    plan_max_active_jobs: int = Field(1000, description="Default plan: a tenant's queued + running jobs.")
    plan_max_width: int = Field(1024, description="Default plan: largest `params.width`.")
    plan_max_height: int = Field(1024, description="Default plan: largest `params.height`.")
    plan_max_frames: int = Field(121, description="Default plan: largest `params.num_frames`.")
    plan_max_steps: int = Field(100, description="Default plan: largest `params.steps`.")
    plan_max_priority: str = Field(
        "high", description="Default plan: highest `priority` (`low` < `normal` < `high`)."
    )
    plan_max_prompt_chars: int = Field(4000, description="Default plan: longest prompt in characters.")
    plan_allowed_models: str = Field(
        "",
        description="Default plan: the models a job may run, comma-separated ids (`echo`: that id in "
        "every stage; `video:echo`: one stage's); empty: every model.",
    )
    admission_max_text_backlog: int = Field(
        10000,
        description="Jobs waiting for the text stage (queued) above which new jobs get 503 + Retry-After.",
    )
    admission_max_video_backlog: int = Field(
        10000, description="Unfinished video jobs above which new video jobs get 503 + Retry-After."
    )
    admission_max_wait_s: float = Field(
        0.0, description="New jobs whose estimated wait is over this get 503; `0` turns the check off."
    )
    admission_cache_s: float = Field(1.0, description="How long one process reuses a backlog measurement.")

    # -- the production stack (`bin/start`, `genqueue start`: app.stack)
    stop_timeout_s: float = Field(
        60.0,
        description="`genqueue start`: after SIGTERM, how long the processes get to finish (workers their "
        "running tasks, web its requests) before SIGQUIT, then SIGKILL; unfinished tasks are redelivered.",
    )
    flower_basic_auth: SecretStr | None = Field(
        None,
        description="`genqueue flower`: `user:password[,user2:password2]`, the HTTP basic auth of "
        "Flower's UI and API (no comma in a password). Flower refuses to start without it unless "
        "GENQUEUE_FLOWER_UNAUTHENTICATED is `true`.",
    )
    flower_unauthenticated: bool = Field(
        False,
        description="`genqueue flower`: `true` serves Flower's UI and API without authentication, on a "
        "loopback address only (development machines).",
    )

    @property
    def worker_metrics_files(self) -> Path:
        """The worker's private prometheus multiprocess directory: `<worker_metrics_dir>/<port>`."""
        return (self.worker_metrics_dir / str(self.worker_metrics_port)).resolve()

    # -- logs
    log_format: Literal["json", "text"] = Field(
        "json",
        description="`json`: one JSON object per line (with `request_id`, `job_id`, `tenant`, `stage`, "
        "`task_id` where known) from gunicorn, the workers and beat; `text`: plain lines for a terminal. "
        "`genqueue demo` and `genqueue serve` default to `text`.",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = Field(
        "INFO",
        description="The lowest level logged. Celery workers and beat take their `-l` level when this is "
        "not set; `genqueue` commands log WARNING unless `-v` or this is set.",
    )

    @field_validator("extra_models", "model_swaps")
    @classmethod
    def _extra_models(cls, value: str) -> str:
        from models.catalog import parse_extra_models  # a light module that needs this one's class

        parse_extra_models(value)  # a malformed entry fails at startup, not per request
        return value

    @field_validator("log_level", "log_format", mode="before")
    @classmethod
    def _case(cls, value: object) -> object:
        # `info` and `JSON` mean what they say
        if not isinstance(value, str):
            return value
        levels = ("debug", "info", "warning", "error", "critical")
        return value.upper() if value.lower() in levels else value.lower()

    # -- metrics (docs/OPERATIONS.md)
    exporter_timeout_s: float = Field(
        2.0,
        gt=0,
        description="`genqueue exporter`: how long one scrape waits for each source (broker, database); "
        "a source past it is reported down (`genqueue_exporter_up 0`), not waited for.",
    )

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


def from_environment() -> Settings:
    """Settings read from the environment, for code that no caller hands a Settings.

    The adapters the registry builds (the echo video adapter, SmolLM2's cache) and other
    process-level reads go through here rather than os.environ, so every GENQUEUE_ variable is a
    documented field. Building Settings costs ~5 ms, too much for the echo adapter's per-batch
    read, so the result is reused while the variables it reads are unchanged (tests change the
    environment of a running process; a change is seen on the next call). A copy is returned,
    so a caller that changes it changes only its own.
    """
    return _from_environment(_settings_environ()).model_copy()


def _settings_environ() -> tuple[tuple[str, str], ...]:
    return tuple(
        sorted((k, v) for k, v in os.environ.items() if k.upper().startswith("GENQUEUE_") or k in _ALIASES)
    )


_ALIASES = frozenset({"DATABASE_URL", "BROKER_URL"})


@functools.lru_cache(maxsize=4)
def _from_environment(environ: tuple[tuple[str, str], ...]) -> Settings:
    return Settings()  # `environ` is the cache key: Settings reads os.environ itself
