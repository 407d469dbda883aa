"""The S3-compatible backend (AWS S3, MinIO, Ceph...) through boto3.

A write is staged in a local temp file and published in one request: a single PUT, or a
multipart upload that becomes visible only when it is completed at the very end. A worker
killed midway leaves no object (an unfinished multipart upload is invisible; sweep() aborts it),
and a redelivered task PUTs the same deterministic key again, replacing it: never a duplicate.
"""

from __future__ import annotations

import logging
import os
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO, cast

from models.settings import Settings
from models.storage.base import ObjectInfo, Storage, StorageError, check_key

log = logging.getLogger(__name__)

# Called after each uploaded part with (key, part number): a test pauses an upload midway here.
PartHook = Callable[[str, int], None]
_part_hooks: list[PartHook] = []


def on_part(hook: PartHook) -> None:
    """Register a hook run after each multipart part (tests: a kill in the middle of an upload)."""
    _part_hooks.append(hook)


def _outage(exc: BaseException) -> BaseException:
    """botocore's connection failures as the builtin ConnectionError the retry policy knows."""
    import botocore.exceptions as bx

    if isinstance(exc, bx.EndpointConnectionError | bx.ConnectTimeoutError | bx.ReadTimeoutError):
        return ConnectionError(f"object storage unreachable: {exc}")
    if isinstance(exc, bx.ConnectionClosedError):
        return ConnectionError(f"object storage closed the connection: {exc}")
    return exc


@contextmanager
def _translated() -> Iterator[None]:
    try:
        yield
    except Exception as exc:
        mapped = _outage(exc)
        if mapped is exc:
            raise
        raise mapped from exc


class _Reader:
    """A seekable reader over one object: each read after a seek is a ranged GET from there on.

    Deliberately not an io.RawIOBase: no fileno(), so a WSGI server never tries sendfile on it.
    """

    def __init__(self, client: Any, bucket: str, key: str, size: int) -> None:
        self._client, self._bucket, self._key, self._size = client, bucket, key, size
        self._pos = 0
        self._body: Any = None  # the open GET's streaming body

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        base = {os.SEEK_SET: 0, os.SEEK_CUR: self._pos, os.SEEK_END: self._size}[whence]
        if base + offset != self._pos:
            self._drop()
            self._pos = base + offset
        return self._pos

    def read(self, n: int = -1) -> bytes:
        if self._pos >= self._size:
            return b""
        if self._body is None:
            with _translated():
                resp = self._client.get_object(
                    Bucket=self._bucket, Key=self._key, Range=f"bytes={self._pos}-"
                )
            self._body = resp["Body"]
        with _translated():
            data = cast(bytes, self._body.read(None if n < 0 else n))
        self._pos += len(data)
        return data

    def _drop(self) -> None:
        if self._body is not None:
            self._body.close()  # the rest of the object is never transferred
            self._body = None

    def close(self) -> None:
        self._drop()

    def __enter__(self) -> _Reader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class S3Storage(Storage):
    """Objects are `<prefix><key>` in one bucket."""

    def __init__(self, client: Any, bucket: str, prefix: str = "", part_bytes: int = 8 << 20) -> None:
        self._client, self.bucket, self.prefix, self.part_bytes = client, bucket, prefix, part_bytes

    def __repr__(self) -> str:  # never the credentials
        return f"S3Storage(bucket={self.bucket!r}, prefix={self.prefix!r})"

    @classmethod
    def from_settings(cls, s: Settings) -> S3Storage:
        import boto3
        from botocore.config import Config

        if not s.storage_s3_bucket:
            raise ValueError("storage_backend=s3 needs storage_s3_bucket (GENQUEUE_STORAGE_S3_BUCKET)")

        def secret(value: Any) -> str | None:
            return value.get_secret_value() if value is not None else None

        client = boto3.session.Session().client(
            "s3",
            endpoint_url=s.storage_s3_endpoint_url or None,
            region_name=s.storage_s3_region or None,
            # None: boto3's own chain (AWS_* variables, a profile, the instance's role).
            aws_access_key_id=secret(s.storage_s3_access_key_id),
            aws_secret_access_key=secret(s.storage_s3_secret_access_key),
            config=Config(
                signature_version="s3v4",
                s3={"addressing_style": s.storage_s3_addressing_style},
                connect_timeout=s.storage_s3_timeout_s,
                read_timeout=s.storage_s3_timeout_s,
                retries={"max_attempts": 3, "mode": "standard"},
                # Checksums only where S3 requires them: botocore's newer default (a CRC trailer on
                # every upload) is refused by many S3-compatible servers.
                request_checksum_calculation="when_required",
                response_checksum_validation="when_required",
            ),
        )
        return cls(client, s.storage_s3_bucket, s.storage_s3_prefix, s.storage_s3_part_bytes)

    def _key(self, key: str) -> str:
        return f"{self.prefix}{check_key(key)}"

    @contextmanager
    def writing(self, key: str, content_type: str) -> Iterator[Path]:
        full = self._key(key)
        with tempfile.TemporaryDirectory(prefix="genqueue-upload-") as scratch:
            path = Path(scratch) / Path(key).name
            yield path
            with _translated():
                self._upload(full, path, content_type)

    def _upload(self, full: str, path: Path, content_type: str) -> None:
        size = path.stat().st_size
        with path.open("rb") as f:
            if size <= self.part_bytes:
                self._client.put_object(Bucket=self.bucket, Key=full, Body=f, ContentType=content_type)
                return
            upload = self._client.create_multipart_upload(
                Bucket=self.bucket, Key=full, ContentType=content_type
            )
            uid = upload["UploadId"]
            try:
                parts = []
                for number in range(1, -(-size // self.part_bytes) + 1):
                    chunk = f.read(self.part_bytes)
                    part = self._client.upload_part(
                        Bucket=self.bucket, Key=full, UploadId=uid, PartNumber=number, Body=chunk
                    )
                    parts.append({"PartNumber": number, "ETag": part["ETag"]})
                    for hook in _part_hooks:
                        hook(full, number)
                # The object appears here, whole, or not at all.
                self._client.complete_multipart_upload(
                    Bucket=self.bucket, Key=full, UploadId=uid, MultipartUpload={"Parts": parts}
                )
            except BaseException:
                try:  # best effort: otherwise sweep() (or a bucket lifecycle rule) aborts it
                    self._client.abort_multipart_upload(Bucket=self.bucket, Key=full, UploadId=uid)
                except Exception as exc:
                    log.warning("abort of the multipart upload of %s failed: %s", full, exc)
                raise

    def stat(self, key: str) -> ObjectInfo | None:
        import botocore.exceptions as bx

        try:
            full = self._key(key)
        except KeyError:
            return None
        try:
            with _translated():
                head = self._client.head_object(Bucket=self.bucket, Key=full)
        except bx.ClientError as exc:
            if exc.response.get("Error", {}).get("Code") in ("404", "NoSuchKey", "NotFound"):
                return None
            raise StorageError(f"HEAD {full}: {exc}") from exc
        return ObjectInfo(int(head["ContentLength"]), str(head["ETag"]).strip('"'), head["LastModified"])

    def open(self, key: str) -> BinaryIO:
        info = self.stat(key)
        if info is None:
            raise FileNotFoundError(key)
        return cast(BinaryIO, _Reader(self._client, self.bucket, self._key(key), info.size))

    def url(self, key: str, expires_in: int, content_type: str) -> str | None:
        params = {"Bucket": self.bucket, "Key": self._key(key), "ResponseContentType": content_type}
        return cast(
            str, self._client.generate_presigned_url("get_object", Params=params, ExpiresIn=expires_in)
        )

    def delete_prefix(self, prefix: str) -> int:
        full = self._key(prefix.rstrip("/")) + "/"
        removed = 0
        with _translated():
            for page in self._client.get_paginator("list_objects_v2").paginate(
                Bucket=self.bucket, Prefix=full
            ):
                keys = [{"Key": o["Key"]} for o in page.get("Contents", [])]
                if keys:
                    self._client.delete_objects(Bucket=self.bucket, Delete={"Objects": keys, "Quiet": True})
                    removed += len(keys)
        self.sweep(prefix)  # an upload still unfinished would otherwise appear after the delete
        return removed

    def sweep(self, prefix: str) -> int:
        full = self._key(prefix.rstrip("/")) + "/"
        aborted = 0
        with _translated():
            listing = self._client.list_multipart_uploads(Bucket=self.bucket, Prefix=full)
            for upload in listing.get("Uploads", []):
                self._client.abort_multipart_upload(
                    Bucket=self.bucket, Key=upload["Key"], UploadId=upload["UploadId"]
                )
                aborted += 1
        return aborted
