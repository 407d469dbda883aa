"""The job API's response models as /openapi.json documents them (webhooks: app.webhooks_openapi)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Status = Literal["queued", "running", "succeeded", "failed", "canceled"]


class _Doc(BaseModel):
    model_config = ConfigDict(extra="forbid")


class JobImage(_Doc):
    """One image of an image job, in both formats it is written in."""

    index: int = Field(ge=0, le=3)
    png_url: str
    webp_url: str = Field(description="The same pixels, lossless WebP.")
    png_signed_url: str | None = Field(description="No API key needed (an `<img src>`); null without a key.")
    webp_signed_url: str | None


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
    images: list[JobImage] | None = Field(
        description="A succeeded image job's `num_images` images; null for other jobs and until then. "
        "thumbnail_url is the first image's."
    )


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
    image_s: float | None
    gpu_s: float | None


class Job(_Doc):
    """The job resource (models.resource.job_resource)."""

    id: str
    object: Literal["job"]
    status: Status
    stage: Literal["text", "video", "image"] | None
    progress: int = Field(ge=0, le=100)
    queue_position: int | None = Field(description="1-based place among queued jobs; null unless queued.")
    modality: Literal["text", "video", "image"]
    prompt: str
    params: dict[str, Any] = Field(description="Complete: every omitted param filled with its default.")
    priority: Literal["high", "normal", "low"]
    outputs: JobOutputs
    error: JobError | None
    attempts: int = Field(description="Runs of the current stage: retries and redeliveries included.")
    degraded: dict[str, Any] | None = Field(
        description="Set when the video or image stage was retried at a lower cost: reason, from, to."
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
    image: float = Field(description="GPU seconds of the image stage, likewise.")
    total: float


class UsageGroup(_Doc):
    key: str = Field(description="`YYYY-MM-DD` (UTC), the modality, or `<stage>:<model>` (`-`: none ran).")
    stage: Literal["text", "video", "image"] | None = Field(None, description="group_by=model only.")
    model: str | None = Field(None, description="group_by=model only; null: no model ran that stage.")
    jobs: UsageJobs
    gpu_s: UsageGpu
    tokens: int
    frames: int
    images: int
    cache_hits: int = Field(description="Jobs answered by an identical one: cached copies and followers.")


class UsageTotals(_Doc):
    jobs: UsageJobs = Field(description="Jobs submitted in the window, by their status now.")
    gpu_s: UsageGpu
    tokens: int = Field(description="Tokens the text model generated.")
    frames: int = Field(description="Frames the video model rendered.")
    images: int = Field(description="Images the image model rendered.")
    cache_hits: int = Field(description="Jobs answered by an identical one: cached copies and followers.")


class Usage(_Doc):
    """The calling tenant's usage (models.usage.usage_resource)."""

    object: Literal["usage"]
    from_: str = Field(alias="from", description="Start of the window (inclusive).", json_schema_extra=_TIME)
    to: str = Field(description="End of the window (exclusive), UTC.", json_schema_extra=_TIME)
    group_by: Literal["day", "model", "modality"] | None
    total: UsageTotals
    groups: list[UsageGroup] = Field(description="Key ascending; empty without group_by.")
