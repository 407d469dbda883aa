"""The public job resource: its pydantic models (the /openapi.json schemas) and the one serializer.

The models are the only definition of the resource: job_resource builds a `Job` and dumps it, so
a field added here appears in every answer (API, CLI, webhook payloads) and in the document.
To add one: declare it on its model below (with a `description`), and set it in job_model; a
model without it, or a value for a field the model lacks, is a ValidationError at once.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from models.job import Job as JobRow
from models.job import JobStatus, Modality
from models.media_links import MAX_IMAGES, MediaSigner, image_count, image_variant
from models.retention import expires_at

Status = Literal["queued", "running", "succeeded", "failed", "canceled"]
FILM_MODALITIES = (Modality.VIDEO, Modality.STORYBOARD)  # the jobs whose output is an MP4


class Resource(BaseModel):
    """A response model: closed (an undocumented field is an error, not a silent extra)."""

    model_config = ConfigDict(extra="forbid")

    def public(self) -> dict[str, Any]:
        """The JSON answer. Optional fields that were never set (those with a default) stay out,
        as they always did; a field set to None is a null."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)


def iso(value: datetime | None) -> str | None:
    """UTC timestamps as the API writes them: ISO 8601 with a `Z`."""
    return value.isoformat().replace("+00:00", "Z") if value else None


class JobImage(Resource):
    """One image of an image job, in both formats it is written in."""

    index: int = Field(ge=0, le=MAX_IMAGES - 1)
    png_url: str
    webp_url: str = Field(description="The same pixels, lossless WebP.")
    png_signed_url: str | None = Field(description="No API key needed (an `<img src>`); null without a key.")
    webp_signed_url: str | None


class JobOutputs(Resource):
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


class JobVariant(Resource):
    """One output variant of a video job (params.variants), made after the job succeeded."""

    status: Literal["pending", "ready", "failed"]
    url: str | None = Field(None, description="Its download (GET .../content?variant=<name>), once ready.")
    signed_url: str | None = Field(
        None, description="The same without an API key; null without a signing key."
    )
    bytes: int | None = Field(None, description="Its size, once ready.")
    error: str | None = Field(None, description="Why it failed (the job still succeeded).")


class JobError(Resource):
    code: str | None
    message: str | None
    stage: str | None


class StoryboardShot(Resource):
    """One shot of a storyboard: its description, its render's state and, once rendered, its clip."""

    index: int = Field(ge=0, description="0-based place in the film.")
    status: Literal["queued", "running", "succeeded", "failed", "canceled"] = Field(
        description="`canceled`: the job ended (failed or canceled) before this shot rendered."
    )
    description: str = Field(description="What the text stage wrote for this shot (the video prompt).")
    progress: int = Field(ge=0, le=100)
    attempts: int = Field(description="Renders of this shot: retries and redeliveries included.")
    frames: int | None
    seconds: float | None = Field(description="The render's wall time (0 for a copy).")
    cached: bool = Field(
        False,
        description="Copied from an identical shot the tenant already rendered (same description, "
        "size, frames, steps, seed and model version): rendered once, stored for each job.",
    )
    video_url: str | None = Field(description="The shot's own MP4, once rendered (also while the job runs).")
    error: JobError | None


class Storyboard(Resource):
    """A storyboard job's shot list and shots (GET /v1/jobs/{id}); the film is outputs.video_url."""

    title: str | None = Field(description="The film's title from the text stage; null before it.")
    parsed: Literal["json", "repaired", "split"] | None = Field(
        description="How the text model's answer became the shot list: valid JSON, repaired JSON, "
        "or split from its text (a storyboard never fails on the answer's format)."
    )
    shots: list[StoryboardShot] | None = Field(
        description="Every shot, in film order, once the text stage wrote them; null in listings "
        "and webhook payloads (GET the job for them)."
    )
    contact_sheet_url: str | None = Field(description="One frame per shot as a JPEG, once the film is ready.")


class JobTimings(Resource):
    created_at: str | None
    started_at: str | None
    text_completed_at: str | None
    completed_at: str | None
    queue_s: float | None
    text_s: float | None
    video_s: float | None
    image_s: float | None
    gpu_s: float | None


class JobModel(Resource):
    asked: str | None = Field(description="The model id the job named for the stage; null: the default.")
    id: str | None = Field(description="The model that ran (differs after a degraded retry); null before.")
    version: str | None = Field(description="Its version (package version, or a local folder's stamp).")


class Job(Resource):
    """The job resource (models.resource.job_resource)."""

    id: str
    object: Literal["job"]
    status: Status
    stage: Literal["text", "video", "image", "shots", "stitch"] | None
    progress: int = Field(ge=0, le=100)
    queue_position: int | None = Field(description="1-based place among queued jobs; null unless queued.")
    modality: Literal["text", "video", "image", "storyboard"]
    prompt: str
    params: dict[str, Any] = Field(description="Complete: every omitted param filled with its default.")
    priority: Literal["high", "normal", "low"]
    outputs: JobOutputs
    error: JobError | None
    attempts: int = Field(description="Runs of the current stage: retries and redeliveries included.")
    degraded: dict[str, Any] | None = Field(
        description="Set when the video or image stage was retried at a lower cost: reason, from, to."
    )
    models: dict[str, JobModel] = Field(
        description="Per stage (`text`, `video`, `image`): the model asked for and the one that ran, "
        "with its version."
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
    storyboard: Storyboard | None = Field(
        None, description="A storyboard job's title and shots; absent on other jobs."
    )
    variants: dict[str, JobVariant] | None = Field(
        None,
        description="A video job's output variants (params.variants: webm, preview, upscale), each "
        "pending until a CPU worker made it; absent when the job asked for none.",
    )


class JobList(Resource):
    data: list[Job]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null on the last.")


class JobBatch(Resource):
    jobs: list[Job] = Field(description="The batch's jobs, in the order they were submitted.")


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return round((end - start).total_seconds(), 3) if start and end else None


def _signed(
    job: JobRow,
    signer: MediaSigner | None,
    base_url: str,
    has_text: bool,
    has_video: bool,
    has_thumbnail: bool,
) -> dict[str, str | None]:
    """Links that work without an API key until `signed_urls_expire_at`; null without a signer."""
    out: dict[str, str | None] = dict.fromkeys(
        ("text_signed_url", "video_signed_url", "thumbnail_signed_url", "signed_urls_expire_at")
    )
    if signer is None or not (has_text or has_thumbnail):
        return out
    expires = signer.expires()
    for variant, present in (("text", has_text), ("video", has_video), ("thumbnail", has_thumbnail)):
        if present:
            out[f"{variant}_signed_url"] = _signed_url(job, signer, base_url, variant, expires)
    out["signed_urls_expire_at"] = iso(datetime.fromtimestamp(expires, UTC))
    return out


def _signed_url(job: JobRow, signer: MediaSigner, base_url: str, variant: str, expires: int) -> str:
    return f"{base_url.rstrip('/')}/v1/media/{job.id}/{variant}?{signer.query(job.id, variant, expires)}"


def _images(job: JobRow, content: str, signer: MediaSigner | None, base_url: str) -> list[JobImage]:
    """A finished image job's images: per image its PNG and WebP download (and signed) links."""
    expires = signer.expires() if signer is not None else 0

    def signed(index: int, fmt: str) -> str | None:
        return _signed_url(job, signer, base_url, image_variant(index, fmt), expires) if signer else None

    def url(index: int, fmt: str) -> str:
        return f"{content}?variant=image&index={index}&format={fmt}"

    return [
        JobImage(
            index=index,
            png_url=url(index, "png"),
            webp_url=url(index, "webp"),
            png_signed_url=signed(index, "png"),
            webp_signed_url=signed(index, "webp"),
        )
        for index in range(image_count(job.params))
    ]


def job_model(
    job: JobRow,
    base_url: str = "",
    queue_position: int | None = None,
    signer: MediaSigner | None = None,
    signed_base_url: str = "",
    retention_s: int | None = None,
    shots: Sequence[Any] | None = None,
) -> Job:
    """The job as GET /v1/jobs/{id} returns it; signed links (absolute: `signed_base_url`) with a signer.

    `shots`: a storyboard's job_shots rows (models.shot_states.rows), where the answer has them.
    """
    ready = job.status == JobStatus.SUCCEEDED
    content = f"{base_url}/v1/jobs/{job.id}/content"
    has_video = bool(ready and job.modality in FILM_MODALITIES and job.artifact_path)
    has_images = bool(ready and job.modality == Modality.IMAGE and job.artifact_path)
    # The usage definition (models.usage): every attempt's GPU share, not the last attempt's wall time.
    gpu = [s for s in (job.text_gpu_s, job.video_gpu_s, job.image_gpu_s) if s is not None]
    resource = Job(
        id=str(job.id),
        object="job",
        status=job.status,
        stage=job.stage,
        progress=job.progress,
        queue_position=queue_position if job.status == JobStatus.QUEUED else None,
        modality=job.modality,
        prompt=job.prompt,
        params=job.params or {},
        priority=job.priority,
        outputs=JobOutputs(
            text=job.output_text,
            text_url=f"{content}?variant=text" if job.output_text is not None else None,
            video_url=f"{content}?variant=video" if has_video else None,
            thumbnail_url=f"{content}?variant=thumbnail" if has_video or has_images else None,
            **_signed(
                job, signer, signed_base_url, job.output_text is not None, has_video, has_video or has_images
            ),
            images=_images(job, content, signer, signed_base_url) if has_images else None,
        ),
        error=(
            JobError(code=job.error_code, message=job.error_message, stage=job.error_stage)
            if job.error_code
            else None
        ),
        attempts=job.attempts,
        degraded=job.degraded,
        # Per stage: the model id asked for (named or default), and the id and version that ran.
        models={
            stage: JobModel(asked=m.get("asked"), id=m.get("id"), version=m.get("version"))
            for stage, m in (job.models or {}).items()
        },
        cached=bool(job.cached),
        source_job_id=str(job.source_job_id) if job.source_job_id else None,
        timings=JobTimings(
            created_at=iso(job.created_at),
            started_at=iso(job.started_at),
            text_completed_at=iso(job.text_completed_at),
            completed_at=iso(job.completed_at),
            queue_s=_seconds(job.created_at, job.started_at),
            text_s=job.text_s,
            video_s=job.video_s,
            image_s=job.image_s,
            gpu_s=round(sum(gpu), 3) if gpu else None,
        ),
        metadata=job.meta or {},
        # Retention (models.retention): when the outputs go, and whether they have.
        expires_at=iso(expires_at(job, retention_s)),
        data_removed=job.data_removed_at is not None,
        **({"storyboard": _storyboard(job, content, shots)} if job.modality == Modality.STORYBOARD else {}),
    )
    if job.variants:  # set only then: a job that asked for none has no `variants` key
        resource.variants = _variants(job, content, signer, signed_base_url)
    return resource


def _storyboard(job: JobRow, content: str, shots: Sequence[Any] | None) -> Storyboard:
    """The storyboard's title (from the stored shot list) and its shots' states."""
    plan: dict[str, Any] = {}
    if job.output_text:
        try:
            plan = json.loads(job.output_text)
        except ValueError:
            plan = {}
    active = job.status in (JobStatus.QUEUED, JobStatus.RUNNING)
    shots_out = None
    if shots is not None:
        shots_out = [
            StoryboardShot(
                index=shot.idx,
                # An open shot of a job that ended will not render.
                status=shot.status if active or shot.status in ("succeeded", "failed") else "canceled",
                description=shot.description,
                progress=shot.progress,
                attempts=shot.attempts,
                frames=shot.frames,
                seconds=shot.seconds,
                cached=shot.source_job_id is not None,
                video_url=f"{content}?variant=shot&index={shot.idx}" if shot.status == "succeeded" else None,
                error=JobError(code=shot.error_code, message=shot.error_message, stage="shots")
                if shot.error_code
                else None,
            )
            for shot in shots
        ]
    ready = job.status == JobStatus.SUCCEEDED and bool(job.artifact_path)
    return Storyboard(
        title=plan.get("title"),
        parsed=plan.get("parsed"),
        shots=shots_out,
        contact_sheet_url=f"{content}?variant=contact_sheet" if ready else None,
    )


def _variants(job: JobRow, content: str, signer: MediaSigner | None, base_url: str) -> dict[str, JobVariant]:
    """Each asked variant's status; its links once it is ready (and the job's files are still there)."""
    out = {}
    expires = signer.expires() if signer is not None else 0
    for name, slot in (job.variants or {}).items():
        ready = slot.get("status") == "ready" and job.data_removed_at is None
        out[name] = JobVariant(
            status=slot.get("status", "pending"),
            url=f"{content}?variant={name}" if ready else None,
            signed_url=_signed_url(job, signer, base_url, name, expires) if ready and signer else None,
            bytes=slot.get("bytes") if ready else None,
            error=slot.get("error"),
        )
    return out


def job_resource(
    job: JobRow,
    base_url: str = "",
    queue_position: int | None = None,
    signer: MediaSigner | None = None,
    signed_base_url: str = "",
    retention_s: int | None = None,
) -> dict[str, Any]:
    """job_model as JSON: what the API, the CLI and webhook payloads carry."""
    return job_model(job, base_url, queue_position, signer, signed_base_url, retention_s).public()


def job_list(jobs: list[Job], next_cursor: str | None) -> dict[str, Any]:
    """A page of GET /v1/jobs."""
    return JobList(data=jobs, next_cursor=next_cursor).public()


def job_batch_json(jobs: list[Job]) -> str:
    """The answer of POST /v1/jobs/batch as JSON text, serialised by pydantic in one pass; what
    `.public()` then json.dumps would write, the keys in the resource's order."""
    return JobBatch(jobs=jobs).model_dump_json(by_alias=True, exclude_unset=True)
