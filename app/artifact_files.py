"""Which file under the artifact directory serves a content variant of a job: /content and /v1/media alike."""

from __future__ import annotations

from pathlib import PurePosixPath

from models import Job, JobStatus
from models.job import Modality
from models.media_links import IMAGE_FORMATS, image_count, image_variant, parse_image_variant
from tasks.contract.names import IMAGE_MIMETYPES, THUMBNAIL_NAME, image_name

# The variant GET /v1/jobs/{id}/content serves when the query names none.
DEFAULT_VARIANT: dict[str, str] = {Modality.TEXT: "text", Modality.VIDEO: "video", Modality.IMAGE: "image"}
# What ?variant= may say; `image` takes `index` and `format` (the signed links name the file itself).
CONTENT_VARIANTS = ("video", "text", "thumbnail", "image")


def has_variant(modality: str, variant: str) -> bool:
    """Whether a job of `modality` ever has the file variant `variant` (thumbnail, video, image-N.fmt)."""
    if variant == "thumbnail":
        return modality in (Modality.VIDEO, Modality.IMAGE)
    if variant == "video":
        return modality == Modality.VIDEO
    return modality == Modality.IMAGE and parse_image_variant(variant) is not None


def file_of(job: Job, variant: str) -> tuple[str, str] | None:
    """(path relative to the artifact directory, media type) of a finished job's file variant;
    None while the job has not succeeded or when it has no such file (an image index beyond its count)."""
    if job.status != JobStatus.SUCCEEDED or not job.artifact_path or not has_variant(job.modality, variant):
        return None
    folder = PurePosixPath(job.artifact_path).parent
    if variant == "thumbnail":
        return str(folder / THUMBNAIL_NAME), "image/jpeg"
    if variant == "video":
        return job.artifact_path, "video/mp4"
    parsed = parse_image_variant(variant)
    assert parsed is not None  # has_variant checked it
    index, fmt = parsed
    if index >= image_count(job.params):
        return None
    return str(folder / image_name(index, fmt)), IMAGE_MIMETYPES[fmt]


def image_query(index: str | None, fmt: str | None) -> tuple[str | None, list[dict[str, str]]]:
    """The file variant `?variant=image&index=&format=` names, or the field errors (422) it has."""
    errors = []
    if index is None:
        index = "0"
    if not (index.isascii() and index.isdigit() and len(index) <= 2):
        errors.append({"field": "index", "message": "must be an integer from 0 to num_images - 1"})
    if fmt is None:
        fmt = "png"
    if fmt not in IMAGE_FORMATS:
        errors.append({"field": "format", "message": f"must be one of: {', '.join(IMAGE_FORMATS)}"})
    return (None if errors else image_variant(int(index), fmt)), errors
