"""A job's files as an HTTP answer, for /v1/jobs/{id}/content and /v1/media: one definition of
which object a variant is and how it is downloaded (Range, ETag, 304) over models.storage.

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
from models import Job
from tasks.contract.names import THUMBNAIL_NAME

FILE_VARIANTS: dict[str, str] = {"video": "video/mp4", "thumbnail": "image/jpeg"}  # variant -> type


def object_key(job: Job, variant: str) -> str:
    """The storage key of a succeeded video job's `variant` (a cached copy's are its source's)."""
    assert job.artifact_path is not None
    video = PurePosixPath(job.artifact_path)
    return str(video.parent / THUMBNAIL_NAME) if variant == "thumbnail" else str(video)


def send_variant(job: Job, variant: str, presign_s: int | None = None) -> Response:
    """The object behind `variant`, streamed conditionally (Range -> 206, 416 beyond the end,
    ETag -> 304), or a 302 to a URL valid `presign_s` seconds where asked and the backend has
    one. 404 (problem+json) once the object is gone (the job's outputs cleaned up)."""
    storage, key, mimetype = services().storage, object_key(job, variant), FILE_VARIANTS[variant]
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
