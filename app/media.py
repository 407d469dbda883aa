"""/v1/media: a job's content through a signed, expiring link, no API key (`<video src>`, `<img src>`)."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid

from flask import Blueprint, Response, request

from app import downloads
from app.errors import Forbidden, Gone, NotFound
from app.services import services
from models import Job
from models.db import read_only
from models.media_links import VARIANTS, MediaSigner

bp = Blueprint("media", __name__, url_prefix="/v1")


class InvalidLink(Forbidden):
    slug = "invalid-link"


class ExpiredLink(Forbidden):
    slug = "expired-link"


def signed_base_url() -> str:
    """The origin signed links start with: the configured public one, else this request's."""
    return services().settings.public_base_url.rstrip("/") or request.host_url.rstrip("/")


def signer(ttl_s: int | None = None) -> MediaSigner | None:
    """The server's signer; `ttl_s` (a plan's link lifetime) for the links it issues."""
    sign = services().media_signer
    return sign if sign is None or ttl_s is None else dataclasses.replace(sign, ttl_s=ttl_s)


def _gone(job_id: str, variant: str) -> NotFound:
    # Revoked: the job (or its file) no longer exists, or never had this output.
    return NotFound(f"Job {job_id} has no {variant} (any more).")


def _cached(resp: Response, max_age: int) -> Response:
    """Cacheable by a CDN until the link expires: the link is the capability, not a header."""
    resp.cache_control.no_cache = None
    resp.cache_control.public = True
    resp.cache_control.max_age = max_age
    return resp


@bp.get("/media/<job_id>/<variant>")  # HEAD too (Flask answers it from GET, without the body)
def media(job_id: str, variant: str) -> Response:
    sign = signer()
    if sign is None:
        raise NotFound("Signed links are not enabled on this server.")
    expires, sig = request.args.get("expires", ""), request.args.get("sig", "")
    verdict = sign.verify(job_id, variant, expires, sig)
    if verdict == "invalid":
        raise InvalidLink("The link's signature does not match: it was altered or its key retired.")
    if verdict == "expired":
        raise ExpiredLink("The link has expired; get a fresh one from GET /v1/jobs/{id}.")
    max_age = sign.remaining_s(expires)
    try:
        jid = uuid.UUID(job_id)
    except ValueError:  # signed, so well formed: only a key holder could get here
        raise _gone(job_id, variant) from None
    svc = services()
    with read_only(svc.sessions) as s:
        job = s.get(Job, jid)
    if job is None or not (variant in VARIANTS or downloads.has_variant(job.modality, variant)):
        raise _gone(job_id, variant)
    if job.data_removed_at is not None:
        raise Gone(f"Job {job_id}'s outputs were removed (expired or deleted).")
    if variant == "text":
        if job.output_text is None:
            raise _gone(job_id, variant)
        resp = Response(job.output_text, mimetype="text/plain")
        resp.set_etag(hashlib.sha256(job.output_text.encode()).hexdigest()[:32])
        resp.make_conditional(request)
        return _cached(resp, max_age)
    if downloads.object_of(job, variant) is None:
        raise _gone(job_id, variant)
    presign = max_age if svc.settings.storage_s3_presigned_links else None
    return _cached(downloads.send_variant(job, variant, presign_s=presign), max_age)
