"""The job API's response models as /openapi.json documents them (webhooks: app.webhooks_openapi)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["queued", "running", "succeeded", "failed", "canceled"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobOutputs(_Doc):
    text: str | None
    text_url: str | None
    video_url: str | None
    thumbnail_url: str | None
    text_signed_url: str | None = Field(
        description="Absolute link to the text that needs no API key, valid until signed_urls_expire_at."
    )
    video_signed_url: str | None = Field(
        description="Absolute link to the MP4 that needs no API key (a `<video src>`); Range, HEAD, "
        "CORS; valid until signed_urls_expire_at. Null when the server has no signing key."
    )
    thumbnail_signed_url: str | None = Field(description="Absolute link to the JPEG thumbnail, no API key.")
    signed_urls_expire_at: str | None = Field(description="When the signed links stop working (UTC).")


class JobError(_Doc):
    code: str | None
    message: str | None
    stage: str | None


class JobTimings(_Doc):
    created_at: str | None
    started_at: str | None
    text_completed_at: str | None
    completed_at: str | None
    queue_s: float | None
    text_s: float | None
    video_s: float | None
    gpu_s: float | None


class JobModel(_Doc):
    asked: str | None = Field(description="The model id the job named for the stage; null: the default.")
    id: str | None = Field(description="The model that ran (differs after a degraded retry); null before.")
    version: str | None = Field(description="Its version (package version, or a local folder's stamp).")


class Job(_Doc):
    """The job resource (models.resource.job_resource)."""

    id: str
    object: Literal["job"]
    status: Status
    stage: Literal["text", "video"] | None
    progress: int = Field(ge=0, le=100)
    queue_position: int | None = Field(description="1-based place among queued jobs; null unless queued.")
    modality: Literal["text", "video"]
    prompt: str
    params: dict[str, Any] = Field(description="Complete: every omitted param filled with its default.")
    priority: Literal["high", "normal", "low"]
    outputs: JobOutputs
    error: JobError | None
    attempts: int = Field(description="Runs of the current stage: retries and redeliveries included.")
    degraded: dict[str, Any] | None = Field(
        description="Set when the video stage was retried at a lower cost: reason, from, to."
    )
    models: dict[str, JobModel] = Field(
        description="Per stage (`text`, `video`): the model asked for and the one that ran, with its version."
    )
    cached: bool = Field(description="Answered from an identical earlier job, not computed again.")
    source_job_id: str | None = Field(description="The identical job a cached one reused; else null.")
    timings: JobTimings
    metadata: dict[str, str]
    expires_at: str | None = Field(
        description="When the finished job's outputs, prompt and files are removed (UTC; "
        "`retention_s` after completed_at); null while the job is active or when nothing expires."
    )
    data_removed: bool = Field(
        description="The outputs, prompt and files were removed (expired, or DELETE); content and "
        "signed links answer 410. The job still counts in usage."
    )


class ModelInfo(_Doc):
    """A model a job may name (app.models_api.model_resource)."""

    object: Literal["model"]
    id: str = Field(description="What a job's `model` names.")
    stage: str = Field(description="The pipeline stage it runs (`text`, `video`).")
    modalities: list[str] = Field(description="The job modalities that run this stage.")
    default: bool = Field(description="The stage's model when a job names none.")
    source: Literal["builtin", "directory", "adapter"] = Field(
        description="Bundled, a local model directory, or an adapter class (`module:Class`)."
    )
    version: str = Field(description="Package version or a local folder's stamp; part of the cache key.")
    queue: str = Field(description="The worker queue that serves the stage.")
    warm: bool | None = Field(description="A live worker process has it loaded; null: unknown (Redis down).")
    warm_workers: int | None = Field(description="How many live worker processes have it loaded.")
    allowed: bool = Field(description="The caller's plan lets its jobs run it (else 403 on submit).")
    params: dict[str, Any] = Field(description="JSON Schema of `params` for a job running it: names, bounds.")


class ModelList(_Doc):
    object: Literal["list"]
    data: list[ModelInfo]


class JobList(_Doc):
    data: list[Job]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last.")


class FieldError(_Doc):
    field: str = Field(description="Dotted path of the offending field, e.g. `params.width`.")
    message: str


class Problem(BaseModel):
    """RFC 9457 problem details; extension members (e.g. `job_status`, `checks`) may appear."""

    type: str
    title: str
    status: int
    detail: str
    errors: list[FieldError]


class Health(_Doc):
    status: Literal["ok"]


class Ready(_Doc):
    status: Literal["ready"]
    checks: dict[str, dict[str, Any]]


_TIME: dict[str, Any] = {"format": "date-time"}


class UsageJobs(_Doc):
    total: int
    queued: int
    running: int
    succeeded: int
    failed: int
    canceled: int


class UsageGpu(_Doc):
    text: float = Field(description="GPU seconds of the text stage: every attempt's share, retries included.")
    video: float = Field(description="GPU seconds of the video stage, likewise.")
    total: float


class UsageGroup(_Doc):
    key: str = Field(description="`YYYY-MM-DD` (UTC), the modality, or `<stage>:<model>` (`-`: none ran).")
    stage: Literal["text", "video"] | None = Field(None, description="group_by=model only.")
    model: str | None = Field(None, description="group_by=model only; null: no model ran that stage.")
    jobs: UsageJobs
    gpu_s: UsageGpu
    tokens: int
    frames: int
    cache_hits: int = Field(description="Jobs answered by an identical one: cached copies and followers.")


class UsageTotals(_Doc):
    jobs: UsageJobs = Field(description="Jobs submitted in the window, by their status now.")
    gpu_s: UsageGpu
    tokens: int = Field(description="Tokens the text model generated.")
    frames: int = Field(description="Frames the video model rendered.")
    cache_hits: int = Field(description="Jobs answered by an identical one: cached copies and followers.")


class Usage(_Doc):
    """The calling tenant's usage (models.usage.usage_resource)."""

    object: Literal["usage"]
    from_: str = Field(alias="from", description="Start of the window (inclusive).", json_schema_extra=_TIME)
    to: str = Field(description="End of the window (exclusive), UTC.", json_schema_extra=_TIME)
    group_by: Literal["day", "model", "modality"] | None
    total: UsageTotals
    groups: list[UsageGroup] = Field(description="Key ascending; empty without group_by.")
