"""Tenancy, rate limits and admission control (docs/API.md): the default plan."""

from __future__ import annotations

from pydantic import BaseModel, Field


class TenancySettings(BaseModel):
    """Fields of models.settings.Settings (GENQUEUE_<FIELD>)."""

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
    admission_max_image_backlog: int = Field(
        10000, description="Unfinished image jobs above which new image jobs get 503 + Retry-After."
    )
    admission_max_wait_s: float = Field(
        0.0, description="New jobs whose estimated wait is over this get 503; `0` turns the check off."
    )
    admission_cache_s: float = Field(1.0, description="How long one process reuses a backlog measurement.")
