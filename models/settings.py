"""Runtime settings read from the environment, shared by the web front and the workers."""

from __future__ import annotations

from pathlib import Path

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
    worker_preload: str = ""  # "text", "video" or "text,video": load at worker start, not first task

    db_pool_size: int = 10
    db_max_overflow: int = 10
    db_connect_timeout_s: int = 3
    broker_visibility_timeout_s: int = 7200

    text_soft_time_limit_s: int = 300
    text_time_limit_s: int = 360
    video_soft_time_limit_s: int = 1800
    video_time_limit_s: int = 1900
    max_retries: int = 3
    retry_backoff_s: float = 2.0
    retry_backoff_max_s: float = 300.0
    progress_interval_s: float = 0.5

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
    prompt_max_chars: int = 4000
    default_width: int = 256
    default_height: int = 256
    default_num_frames: int = 17
    default_fps: int = 8
    default_steps: int = 8
    default_max_new_tokens: int = 64

    @property
    def is_sqlite(self) -> bool:
        return self.database_url.startswith("sqlite")
