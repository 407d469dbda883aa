"""Models and workers, their database connections and the broker transport."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, field_validator

from models.model_ids import parse_extra_models


class WorkerSettings(BaseModel):
    """Fields of models.settings.Settings (GENQUEUE_<FIELD>)."""

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
    image_model: str = Field(
        "sana-tiny",
        description="`sana-tiny` (a random-weight SanaPipeline), `echo` (zero cost), a registered name, "
        "or a local diffusers text-to-image directory (e.g. Sana_600M_1024px_diffusers).",
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
        description="`text`, `video`, `image` or a list such as `text,video`: load those models when the "
        "worker process starts, not at its first task.",
    )
    echo_step_seconds: float = Field(
        0.0,
        description="The `echo` video and image adapters sleep this long per step, so tests can catch a task "
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
    worker_held_dir: Path = Field(
        Path("var/worker-held"),
        description="Redis: where a `genqueue worker` keeps one empty file per message it holds "
        "(`<dir>/<pid>/<delivery tag>`), so that if it is killed outright its supervisor puts "
        "those messages back at once instead of after the visibility timeout.",
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

    # -- output variants (tasks.variants, on the `post` queue)
    upscale_model_dir: str = Field(
        "",
        description="A local diffusers upscaler directory (e.g. stable-diffusion-x4-upscaler) for the "
        "`upscale` variant; empty: Lanczos resampling (Pillow), no model. Never downloaded.",
    )
    upscale_steps: int = Field(
        20,
        ge=1,
        le=200,
        description="Denoising steps of the diffusers upscaler (upscale_model_dir) per frame; more: "
        "finer detail, slower. Unused by the Lanczos fallback.",
    )
    upscale_max_side: int = Field(
        2048,
        ge=64,
        description="The longest side an `upscale` variant may have: a video job's width or height "
        "times `upscale_factor` above this is refused (422 on params.upscale_factor).",
    )
    variant_time_limit_s: int = Field(
        600, ge=1, description="The post-processing task's soft time limit (all of a job's variants)."
    )
    variant_stall_s: float = Field(
        900.0,
        gt=0,
        description="A succeeded job whose output variant stayed pending this long without change "
        "gets its post-processing published again by the reaper (a lost message, a dead worker).",
    )
    variant_max_retries: int = Field(
        3, ge=0, description="Retries, with backoff, of a post-processing task a transient error broke."
    )

    @field_validator("extra_models", "model_swaps")
    @classmethod
    def _extra_models(cls, value: str) -> str:
        parse_extra_models(value)  # a malformed entry fails at startup, not per request
        return value
