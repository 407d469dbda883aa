"""Signed, expiring links to a job's content: usable without an API key, e.g. as a `<video src>`."""

from __future__ import annotations

import hashlib
import math
import re
import time
import uuid
from dataclasses import dataclass
from typing import Any, Literal

from itsdangerous import BadData, Signer
from itsdangerous.encoding import base64_decode, base64_encode

from models.settings import Settings

VARIANTS = ("video", "text", "thumbnail")
# An image job's files are variants too: "image-<index>.<format>" (tasks.contract.names.image_name).
IMAGE_FORMATS = ("png", "webp")
# A video job's output variants beside its MP4 (params.variants, produced by tasks.variants).
OUTPUT_VARIANTS = ("webm", "preview", "upscale")
MAX_IMAGES = 4  # the most an image job may ask for (app.schemas), so one digit names each
_IMAGE_VARIANT = re.compile(r"^image-([0-9])\.(png|webp)$")
Verdict = Literal["ok", "invalid", "expired"]
_SALT = "genqueue.media-link"


def image_variant(index: int, fmt: str) -> str:
    """The signed-link variant (and file name) of an image job's `index`th image in `fmt`."""
    return f"image-{index}.{fmt}"


def parse_image_variant(variant: str) -> tuple[int, str] | None:
    """(index, format) of an image variant, None for anything else."""
    match = _IMAGE_VARIANT.match(variant)
    return (int(match.group(1)), match.group(2)) if match else None


def image_count(params: dict[str, Any] | None) -> int:
    """How many images an image job renders: its stored `num_images` (params are complete)."""
    return int((params or {}).get("num_images", 1))


def media_path(job_id: uuid.UUID | str, variant: str) -> str:
    """The path a signed link points at (its query carries `expires` and `sig`)."""
    return f"/v1/media/{job_id}/{variant}"


def _step(ttl_s: int) -> int:
    # Links issued within one step share their expiry: the same URL (a CDN caches it once, a
    # job's ETag stays put between polls) and still at least ttl_s - step seconds of validity.
    return max(1, min(300, ttl_s // 10))


@dataclass(frozen=True)
class MediaSigner:
    """HMAC-SHA256 (itsdangerous) over the path and the expiry. The first key signs; every key
    verifies, so a new key is put first and the old one kept until its links have expired."""

    keys: tuple[str, ...]
    ttl_s: int

    @classmethod
    def from_settings(cls, settings: Settings) -> MediaSigner | None:
        """None when no key is configured: jobs then carry no signed links."""
        raw = settings.media_url_keys.get_secret_value() if settings.media_url_keys else ""
        keys = tuple(k.strip() for k in raw.split(",") if k.strip())
        return cls(keys, settings.media_url_ttl_s) if keys else None

    def _signer(self) -> Signer:
        # itsdangerous signs with the last key of the list and verifies with any.
        return Signer(list(reversed(self.keys)), salt=_SALT, digest_method=hashlib.sha256)

    def expires(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        step = _step(self.ttl_s)
        return math.floor(now / step) * step + self.ttl_s

    def _message(self, job_id: uuid.UUID | str, variant: str, expires: int) -> bytes:
        return f"{media_path(job_id, variant)}\n{expires}".encode()

    def query(self, job_id: uuid.UUID | str, variant: str, expires: int) -> str:
        sig = self._signer().get_signature(self._message(job_id, variant, expires)).decode()
        return f"expires={expires}&sig={sig}"

    def url(self, base_url: str, job_id: uuid.UUID | str, variant: str, now: float | None = None) -> str:
        """`<base_url>/v1/media/<id>/<variant>?expires=<unix s>&sig=<HMAC>`."""
        expires = self.expires(now)
        return f"{base_url.rstrip('/')}{media_path(job_id, variant)}?{self.query(job_id, variant, expires)}"

    def verify(self, job_id: str, variant: str, expires: str, sig: str, now: float | None = None) -> Verdict:
        """Whether a link's signature holds and it has not expired (a bad signature wins)."""
        if not expires.isdigit() or len(expires) > 12 or not sig.isascii():
            return "invalid"
        try:
            # Only the canonical encoding: base64's last character carries spare bits that the
            # decoder ignores, and one link must not have several valid spellings.
            if base64_encode(base64_decode(sig)) != sig.encode():
                return "invalid"
            ok = self._signer().verify_signature(self._message(job_id, variant, int(expires)), sig.encode())
        except BadData:  # malformed base64 (BadData: the decoder's error; BadSignature is one too)
            return "invalid"
        if not ok:
            return "invalid"
        return "ok" if int(expires) > (time.time() if now is None else now) else "expired"

    def remaining_s(self, expires: str, now: float | None = None) -> int:
        """Seconds until a verified link expires: the most a cache may keep its answer."""
        return max(0, int(expires) - math.ceil(time.time() if now is None else now))
