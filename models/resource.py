"""The public job resource: one serializer for the API, the CLI and webhook payloads."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from models.job import Job, JobStatus, Modality
from models.media_links import MediaSigner
from models.retention import expires_at


def _iso(value: datetime | None) -> str | None:
    return value.isoformat().replace("+00:00", "Z") if value else None


def _seconds(start: datetime | None, end: datetime | None) -> float | None:
    return round((end - start).total_seconds(), 3) if start and end else None


def _signed(
    job: Job, signer: MediaSigner | None, base_url: str, has_text: bool, has_video: bool
) -> dict[str, str | None]:
    """Links that work without an API key until `signed_urls_expire_at`; null without a signer."""
    out: dict[str, str | None] = dict.fromkeys(
        ("text_signed_url", "video_signed_url", "thumbnail_signed_url", "signed_urls_expire_at")
    )
    if signer is None or not (has_text or has_video):
        return out
    expires = signer.expires()
    base = f"{base_url.rstrip('/')}/v1/media/{job.id}"
    for variant, present in (("text", has_text), ("video", has_video), ("thumbnail", has_video)):
        if present:
            out[f"{variant}_signed_url"] = f"{base}/{variant}?{signer.query(job.id, variant, expires)}"
    out["signed_urls_expire_at"] = _iso(datetime.fromtimestamp(expires, UTC))
    return out


def job_resource(
    job: Job,
    base_url: str = "",
    queue_position: int | None = None,
    signer: MediaSigner | None = None,
    signed_base_url: str = "",
    retention_s: int | None = None,
) -> dict[str, Any]:
    """The job as GET /v1/jobs/{id} returns it; signed links (absolute: `signed_base_url`) with a signer."""
    ready = job.status == JobStatus.SUCCEEDED
    content = f"{base_url}/v1/jobs/{job.id}/content"
    has_video = bool(ready and job.modality == Modality.VIDEO and job.artifact_path)
    # The usage definition (models.usage): every attempt's GPU share, not the last attempt's wall time.
    gpu = [s for s in (job.text_gpu_s, job.video_gpu_s) if s is not None]
    return {
        "id": str(job.id),
        "object": "job",
        "status": job.status,
        "stage": job.stage,
        "progress": job.progress,
        "queue_position": queue_position if job.status == JobStatus.QUEUED else None,
        "modality": job.modality,
        "prompt": job.prompt,
        "params": job.params or {},
        "priority": job.priority,
        "outputs": {
            "text": job.output_text,
            "text_url": f"{content}?variant=text" if job.output_text is not None else None,
            "video_url": f"{content}?variant=video" if has_video else None,
            "thumbnail_url": f"{content}?variant=thumbnail" if has_video else None,
            **_signed(job, signer, signed_base_url, job.output_text is not None, has_video),
        },
        "error": (
            {"code": job.error_code, "message": job.error_message, "stage": job.error_stage}
            if job.error_code
            else None
        ),
        "attempts": job.attempts,
        "degraded": job.degraded,
        # Per stage: the model id asked for (named or default), and the id and version that ran.
        "models": {
            stage: {"asked": m.get("asked"), "id": m.get("id"), "version": m.get("version")}
            for stage, m in (job.models or {}).items()
        },
        "cached": bool(job.cached),
        "source_job_id": str(job.source_job_id) if job.source_job_id else None,
        "timings": {
            "created_at": _iso(job.created_at),
            "started_at": _iso(job.started_at),
            "text_completed_at": _iso(job.text_completed_at),
            "completed_at": _iso(job.completed_at),
            "queue_s": _seconds(job.created_at, job.started_at),
            "text_s": job.text_s,
            "video_s": job.video_s,
            "gpu_s": round(sum(gpu), 3) if gpu else None,
        },
        "metadata": job.meta or {},
        # Retention (models.retention): when the outputs go, and whether they have.
        "expires_at": _iso(expires_at(job, retention_s)),
        "data_removed": job.data_removed_at is not None,
    }
