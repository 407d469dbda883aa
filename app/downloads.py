"""A job's files as an HTTP answer, for /v1/jobs/{id}/content and /v1/media: one definition of
which object a variant is (video, thumbnail, an image job's image-<index>.<png|webp>, a video
job's output variants webm, preview and upscale) and how it
is downloaded (Range, ETag, 304) over models.storage.

Both backends stream through the API by default: the API key (or the signed link) stays the
capability, the bucket need not be reachable by clients, and the answers (206/416, ETag, CORS)
are the same whatever the backend. A Range is passed through: the S3 reader GETs from the
range's start and stops reading at its end, so a seek in a player costs the range, not the
file. With `storage_s3_presigned_links`, a signed link instead redirects to a presigned URL and
the bucket serves the bytes (offloading the API; the link already was the capability).
"""

from __future__ import annotations

from pathlib import PurePosixPath

from flask import Response, request
from werkzeug.wsgi import wrap_file

from app.errors import NotFound
from app.services import services
from models import Job, JobStatus
from models.job import Modality
from models.media_links import IMAGE_FORMATS, OUTPUT_VARIANTS, image_count, image_variant, parse_image_variant
from tasks.contract.names import (
    CONTACT_SHEET_NAME,
    IMAGE_MIMETYPES,
    THUMBNAIL_NAME,
    VARIANT_FILES,
    artifact_key,
    image_name,
    shot_name,
)

# The media type of each fixed-name file variant; an image job's files are image-<index>.<format>.
FILE_VARIANTS: dict[str, str] = {
    "video": "video/mp4",
    "thumbnail": "image/jpeg",
    "contact_sheet": "image/jpeg",
}
# The variant GET /v1/jobs/{id}/content serves when the query names none.
DEFAULT_VARIANT: dict[str, str] = {
    Modality.TEXT: "text", Modality.VIDEO: "video", Modality.IMAGE: "image", Modality.STORYBOARD: "video",
}  # fmt: skip
# What ?variant= may say; `image` takes `index` and `format`, `shot` takes `index` (the signed
# links name the file itself: image-<index>.<format>, shot-<index>); the output variants (webm,
# preview, upscale) of a video or storyboard job that asked for them.
CONTENT_VARIANTS = ("video", "text", "thumbnail", "image", "shot", "contact_sheet", *OUTPUT_VARIANTS)
FILMS = (Modality.VIDEO, Modality.STORYBOARD)  # the jobs whose output is one MP4


def shot_variant(index: int) -> str:
    """The file variant of a storyboard's `index`th shot."""
    return f"shot-{index}"


def parse_shot_variant(variant: str) -> int | None:
    """The shot index of a `shot-<index>` file variant; None for any other name."""
    head, _, tail = variant.partition("-")
    if head != "shot" or not (tail.isascii() and tail.isdigit() and len(tail) <= 2):
        return None
    return int(tail)


def has_variant(modality: str, variant: str) -> bool:
    """Whether a job of `modality` ever has the file variant `variant` (thumbnail, video,
    image-N.fmt, a storyboard's contact_sheet and shot-N)."""
    if variant == "thumbnail":
        return modality in (*FILMS, Modality.IMAGE)
    if variant == "video" or variant in OUTPUT_VARIANTS:
        return modality in FILMS
    if modality == Modality.STORYBOARD:
        return variant == "contact_sheet" or parse_shot_variant(variant) is not None
    return modality == Modality.IMAGE and parse_image_variant(variant) is not None


def _shot_object(job: Job, index: int) -> tuple[str, str] | None:
    """A storyboard shot's clip: there from its render on, while the job runs too."""
    if job.status not in (JobStatus.RUNNING, JobStatus.SUCCEEDED) or index >= int(
        (job.params or {}).get("shots", 0)
    ):
        return None
    return artifact_key(job.id, shot_name(index)), FILE_VARIANTS["video"]


def object_of(job: Job, variant: str) -> tuple[str, str] | None:
    """(storage key, media type) of a succeeded job's file variant (a cached copy's are its
    source's); None while the job has not succeeded or when it has no such file (an image index
    beyond its count). A storyboard's shots are the exception: each is there once rendered."""
    shot = parse_shot_variant(variant) if job.modality == Modality.STORYBOARD else None
    if shot is not None:
        return _shot_object(job, shot)
    if job.status != JobStatus.SUCCEEDED or not job.artifact_path or not has_variant(job.modality, variant):
        return None
    if variant in OUTPUT_VARIANTS:  # the job's own file (a cached copy makes its own), once ready
        slot = (job.variants or {}).get(variant) or {}
        return (slot["key"], VARIANT_FILES[variant][1]) if slot.get("status") == "ready" else None
    folder = PurePosixPath(job.artifact_path).parent  # the video's or the first PNG's folder
    if variant == "thumbnail":
        return str(folder / THUMBNAIL_NAME), FILE_VARIANTS[variant]
    if variant == "contact_sheet":
        return str(folder / CONTACT_SHEET_NAME), FILE_VARIANTS[variant]
    if variant == "video":
        return job.artifact_path, FILE_VARIANTS[variant]
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


def send_variant(job: Job, variant: str, presign_s: int | None = None) -> Response:
    """The object behind file variant `variant` (video, thumbnail, image-<index>.<format>),
    streamed conditionally (Range -> 206, 416 beyond the end, ETag -> 304), or a 302 to a URL
    valid `presign_s` seconds where asked and the backend has one. 404 (problem+json) when the
    job has no such file, or once the object is gone (the job's outputs cleaned up)."""
    found = object_of(job, variant)
    if found is None:
        raise NotFound(f"Job {job.id} has no {variant}.")
    storage, (key, mimetype) = services().storage, found
    info = storage.stat(key)
    if info is None:
        raise NotFound(f"Job {job.id} has no {variant} (any more).")
    if presign_s is not None and (url := storage.url(key, max(1, presign_s), mimetype)) is not None:
        return Response(status=302, headers={"Location": url})
    try:
        reader = storage.open(key)  # S3: nothing is fetched until the body is read (not for HEAD/304)
    except FileNotFoundError:
        raise NotFound(f"Job {job.id} has no {variant} (any more).") from None
    resp = Response(wrap_file(request.environ, reader), mimetype=mimetype, direct_passthrough=True)
    resp.content_length = info.size
    resp.last_modified = info.modified
    resp.set_etag(info.etag)
    resp.cache_control.no_cache = True  # revalidate (the ETag), as send_file answered before
    resp.make_conditional(request, accept_ranges=True, complete_length=info.size)  # in place
    return resp
