"""Where job artifacts live: one interface (`Storage`) over the local filesystem or an S3 bucket.

Web and workers both go through it: workers publish a finished file whole under a deterministic
key (`<job id>/video.mp4`, the job's `artifact_path`), the API reads it back (whole or a byte
range) or hands out a direct URL, retention, compensation and DELETE remove a job's keys.
"""

from __future__ import annotations

from models.settings import Settings
from models.storage.base import ObjectInfo, Storage, StorageError, check_key
from models.storage.local import LocalStorage

__all__ = ["LocalStorage", "ObjectInfo", "Storage", "StorageError", "check_key", "open_storage"]


def open_storage(settings: Settings) -> Storage:
    """The configured backend; the S3 one imports boto3 only when chosen (and opens no connection)."""
    if settings.storage_backend == "s3":
        from models.storage.s3 import S3Storage

        return S3Storage.from_settings(settings)
    return LocalStorage(settings.artifact_dir)
