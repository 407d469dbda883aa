"""The storage interface every backend implements, and the key rules they share."""

from __future__ import annotations

import abc
from collections.abc import Iterator
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import BinaryIO


class StorageError(RuntimeError):
    """The backend refused an operation (not an outage: those raise ConnectionError, retried)."""


@dataclass(frozen=True)
class ObjectInfo:
    """What a download needs before reading: the size (for Range), a validator, the mtime."""

    size: int
    etag: str  # unquoted; changes whenever the object is rewritten
    modified: datetime


def check_key(key: str) -> str:
    """A key is a relative POSIX path without `..`: a corrupted artifact_path never escapes the root."""
    parts = key.split("/")
    if not key or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts):
        raise KeyError(key)
    return key


class Storage(abc.ABC):
    """put / open / range / delete / url / exists over one root (a folder, or a bucket + prefix)."""

    @abc.abstractmethod
    def writing(self, key: str, content_type: str) -> AbstractContextManager[Path]:
        """A local path to write the object's bytes to; when the block ends without an error the
        file becomes object `key` in one step (readers see the old object or the whole new one,
        never a part), else it is discarded. Rewriting a key replaces it: one object per key."""

    def put(self, key: str, data: bytes, content_type: str) -> int:
        """Store `data` under `key` atomically (see writing()); returns its size."""
        with self.writing(key, content_type) as path:
            path.write_bytes(data)
        return len(data)

    @abc.abstractmethod
    def stat(self, key: str) -> ObjectInfo | None:
        """The object's size and validator; None when there is none (or the key is invalid)."""

    def exists(self, key: str) -> bool:
        return self.stat(key) is not None

    @abc.abstractmethod
    def open(self, key: str) -> BinaryIO:
        """A seekable reader; reading from a seek position fetches only from there on (S3: a
        ranged GET), so a Range download transfers the range, not the object. FileNotFoundError
        when absent."""

    def read_range(self, key: str, start: int, length: int, chunk: int = 256 * 1024) -> Iterator[bytes]:
        """`length` bytes from `start`, in chunks."""
        with self.open(key) as f:
            f.seek(start)
            while length > 0:
                block = f.read(min(chunk, length))
                if not block:
                    return
                length -= len(block)
                yield block

    @abc.abstractmethod
    def url(self, key: str, expires_in: int, content_type: str) -> str | None:
        """A URL that serves the object directly for `expires_in` seconds (S3: presigned), or None
        where the backend has none (local: the API serves it)."""

    @abc.abstractmethod
    def delete_prefix(self, prefix: str) -> int:
        """Remove every object under `prefix` (a job's folder, `<id>/`); idempotent; returns how many."""

    @abc.abstractmethod
    def sweep(self, prefix: str) -> int:
        """Discard what writes killed midway left under `prefix` (temp files, unfinished multipart
        uploads): never visible as objects, but they take space. Returns how many."""
