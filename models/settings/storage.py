"""Services and storage: the database, the broker, where files go, public links."""

from __future__ import annotations

from pathlib import Path

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
        description="Where MP4s and thumbnails are written; shared by the web processes and the video "
        "workers.",
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
        "of it, at most 300 s: links issued together share an expiry, so caches see one URL).",
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
