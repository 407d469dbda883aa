"""Queue names, stable task names and artifact file names: the wire vocabulary of web and workers."""

from __future__ import annotations

import uuid
from pathlib import Path

from models.media_links import IMAGE_FORMATS as IMAGE_FORMATS  # re-exported: every image's formats
from models.media_links import image_variant

# Queues. GPU stages get their own so each is served by workers sized for its model.
TEXT_QUEUE = "text"
VIDEO_QUEUE = "video"
IMAGE_QUEUE = "image"
DEFAULT_QUEUE = "default"
WEBHOOKS_QUEUE = "webhooks"
# CPU work after a job succeeded (tasks.variants): a GPU worker goes on to the next job meanwhile.
POST_QUEUE = "post"
ALL_QUEUES = (TEXT_QUEUE, VIDEO_QUEUE, IMAGE_QUEUE, DEFAULT_QUEUE, WEBHOOKS_QUEUE, POST_QUEUE)

# Task names are part of the wire format: renaming one strands messages already queued.
GENERATE_TEXT = "genqueue.generate_text"
GENERATE_VIDEO = "genqueue.generate_video"
GENERATE_IMAGE = "genqueue.generate_image"
# A storyboard (tasks.storyboard): start_shots fans the shots out as one group of render_shot
# tasks; the shot that finishes the set sends stitch_shots, which joins them into one film.
START_SHOTS = "genqueue.start_shots"
RENDER_SHOT = "genqueue.render_shot"
STITCH_SHOTS = "genqueue.stitch_shots"
COMPENSATE = "genqueue.compensate"
POSTPROCESS = "genqueue.postprocess"  # a succeeded video job's output variants (tasks.variants)
DELIVER_WEBHOOK = "genqueue.deliver_webhook"
RELAY_WEBHOOKS = "genqueue.relay_webhooks"
REAP_STUCK_JOBS = "genqueue.reap_stuck_jobs"
EXPIRE_ARTIFACTS = "genqueue.expire_artifacts"


# A finished video job's files, inside its folder in the artifact storage (models.storage): workers
# write them (tasks.artifacts), the API serves them (app.downloads). The keys are deterministic, so
# a redelivered stage rewrites the same objects instead of adding copies.
VIDEO_NAME = "video.mp4"
THUMBNAIL_NAME = "thumbnail.jpg"
# A video job's output variants (params.variants; models.media_links.OUTPUT_VARIANTS): variant ->
# (file name, media type), beside the MP4 in the job's folder, so retention and DELETE remove them.
VARIANT_FILES: dict[str, tuple[str, str]] = {
    "webm": ("video.webm", "video/webm"),
    "preview": ("preview.webp", "image/webp"),
    "upscale": ("video-upscaled.mp4", "video/mp4"),
}
# An image job's files: image-<index>.png and .webp per image (index 0 .. num_images - 1), named
# as their signed-link variants are (models.media_links).
IMAGE_MIMETYPES = {"png": "image/png", "webp": "image/webp"}


def image_name(index: int, fmt: str = "png") -> str:
    """The file name of an image job's `index`th image in `fmt` (png | webp)."""
    return image_variant(index, fmt)


def shot_name(index: int) -> str:
    """The file name of a storyboard's `index`th shot (0-based), before the stitch joins them."""
    return f"shot-{index:02d}.mp4"


CONTACT_SHEET_NAME = "contact-sheet.jpg"  # a storyboard's one frame per shot, side by side


def shot_task_id(job_id: str, index: int) -> str:
    """The fixed Celery task id of one storyboard shot's render (duplicates are recognisable)."""
    return f"{job_id}.shot-{index}"


def job_prefix(job_id: uuid.UUID | str) -> str:
    """The storage key prefix of everything a job wrote."""
    return f"{job_id}/"


def artifact_key(job_id: uuid.UUID | str, name: str) -> str:
    """The storage key of one of a job's files (what `Job.artifact_path` holds for its video)."""
    return f"{job_prefix(job_id)}{name}"


def job_dir(root: Path, job_id: uuid.UUID | str) -> Path:
    """A job's folder under the artifact directory (the local backend's layout)."""
    return Path(root) / str(job_id)


def stage_task_id(job_id: str, stage: str) -> str:
    """The fixed Celery task id of one job's stage, so duplicates are recognisable."""
    return f"{job_id}.{stage}"
