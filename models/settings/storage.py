"""Services and storage: the database, the broker, where files go, public links."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import AliasChoices, BaseModel, Field, SecretStr


class StorageSettings(BaseModel):
    """Fields of models.settings.Settings (GENQUEUE_<FIELD>)."""

    # -- services and storage
    database_url: str = Field(
        "postgresql+psycopg://postgres@127.0.0.1:5432/genqueue",
        validation_alias=AliasChoices("DATABASE_URL", "GENQUEUE_DATABASE_URL"),
        description="The database (PostgreSQL through psycopg 3); `sqlite:///path` for one process "
        "(the embedded mode).",
    )
    broker_url: str = Field(
        "redis://127.0.0.1:6379/0",
        validation_alias=AliasChoices("BROKER_URL", "GENQUEUE_BROKER_URL"),
        description="The Celery broker: Redis, or RabbitMQ (`amqp://guest:guest@127.0.0.1:5672//`).",
    )
    artifact_dir: Path = Field(
        Path("var/artifacts"),
        description="Where MP4s, PNG/WebP images and thumbnails are written; shared by the web processes "
        "and the video and image workers.",
    )
    storage_backend: Literal["local", "s3"] = Field(
        "local",
        description="Where job artifacts are stored: `local` (files under `artifact_dir`, the default and "
        "the embedded mode's) or `s3` (an S3-compatible bucket: AWS S3, MinIO, Ceph; the `storage_s3_*` "
        "settings).",
    )
    storage_s3_bucket: str = Field(
        "", description="The bucket (it must exist); required with `storage_backend=s3`."
    )
    storage_s3_prefix: str = Field(
        "",
        description="Prepended to every object key (a job's files are `<prefix><job id>/video.mp4`), e.g. "
        "`genqueue/` to share a bucket.",
    )
    storage_s3_endpoint_url: str = Field(
        "",
        description="The S3 API's URL for a non-AWS server (e.g. `http://minio:9000`); empty: AWS, from "
        "the region.",
    )
    storage_s3_region: str = Field(
        "", description="The bucket's region; empty: boto3's default (`AWS_REGION`, the profile)."
    )
    storage_s3_access_key_id: SecretStr | None = Field(
        None,
        description="The access key id; unset: boto3's default chain (`AWS_ACCESS_KEY_ID`, a profile, the "
        "instance or pod role). Never logged.",
    )
    storage_s3_secret_access_key: SecretStr | None = Field(
        None, description="The secret access key that goes with `storage_s3_access_key_id`. Never logged."
    )
    storage_s3_addressing_style: Literal["auto", "path", "virtual"] = Field(
        "auto",
        description="`path` for servers without per-bucket host names (MinIO's default); `auto`: virtual "
        "hosts on AWS, paths for an IP endpoint.",
    )
    storage_s3_part_bytes: int = Field(
        8 << 20,
        ge=64 << 10,
        description="Files larger than this are uploaded in parts of this size (a multipart upload, "
        "visible only once completed); AWS needs at least 5 MiB (5242880).",
    )
    storage_s3_timeout_s: float = Field(10.0, gt=0, description="Connect and read timeout of one S3 request.")
    storage_s3_presigned_links: bool = Field(
        False,
        description="Signed links (`/v1/media/...`) answer 302 to a presigned S3 URL expiring with the link, "
        "so the bucket serves the bytes; needs a bucket clients can reach. Off: the API streams them "
        "(`/v1/jobs/{id}/content` always does).",
    )
    public_base_url: str = Field(
        "",
        description="The API's public origin (e.g. `https://genqueue.example.com`) for absolute links; "
        "empty: relative URLs.",
    )
    media_url_keys: SecretStr | None = Field(
        None,
        description="Comma-separated keys that sign the links to job outputs (`outputs.*_signed_url`, "
        "`/v1/media/...`): the first signs, every one verifies (rotation: put the new key first, drop "
        "the old one after `media_url_ttl_s`). Every web process must have the same keys. Unset: jobs "
        "carry no signed links.",
    )
    media_url_ttl_s: int = Field(
        3600,
        ge=60,
        le=7 * 24 * 3600,
        description="How long a signed link stays valid (a link is valid this long, less up to a tenth "
        "of it, at most 300 s: links issued together share an expiry, so caches see one URL). The "
        "default plan's: a tenant's plan may set its own `media_url_ttl_s`, within these bounds.",
    )
    cors_origins: list[str] = Field(
        [],
        description='JSON list of origins (e.g. `["https://app.example.com"]`, `["*"]` for any) '
        "allowed to call the API and load media from a browser page (CORS); empty: none.",
    )
    model_cache: Path = Field(
        Path("~/.cache/genqueue/models"),
        description="Where the dequantized SmolLM2 weights and the API's prompt tokenizer "
        "(`prompt-limit/`) are cached; `~` is expanded.",
    )
