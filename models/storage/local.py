"""The local-filesystem backend (default, embedded mode): a folder shared by web and workers."""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from models.storage.base import ObjectInfo, Storage, check_key

# A temp file's name: `<final name>.tmp-<hex><final suffix>`, beside the final one; the suffix kept
# so a writer that picks its format by extension (a .jpg thumbnail) still does.
TEMP_MARK = ".tmp-"


class LocalStorage(Storage):
    """Objects are files under `root`; a write goes to a temp name beside the file, then os.replace."""

    def __init__(self, root: str | os.PathLike[str]) -> None:
        # Absolute, so a later chdir (or send_file's resolution) cannot move it.
        self.root = Path(root).absolute()

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"

    def path(self, key: str) -> Path:
        """The file behind `key` (KeyError for a key that would leave the root)."""
        return self.root / check_key(key)

    @contextmanager
    def writing(self, key: str, content_type: str) -> Iterator[Path]:
        final = self.path(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.with_name(f"{final.name}{TEMP_MARK}{secrets.token_hex(6)}{final.suffix}")
        try:
            yield tmp
            os.replace(tmp, final)  # same directory: atomic
        finally:
            tmp.unlink(missing_ok=True)

    def stat(self, key: str) -> ObjectInfo | None:
        try:
            st = self.path(key).stat()
        except (KeyError, OSError):
            return None
        etag = hashlib.sha256(f"{key}:{st.st_size}:{st.st_mtime_ns}".encode()).hexdigest()[:32]
        return ObjectInfo(st.st_size, etag, datetime.fromtimestamp(st.st_mtime, UTC))

    def open(self, key: str) -> BinaryIO:
        try:
            return self.path(key).open("rb")
        except KeyError:
            raise FileNotFoundError(key) from None

    def url(self, key: str, expires_in: int, content_type: str) -> str | None:
        return None

    def delete_prefix(self, prefix: str) -> int:
        folder = self.path(prefix.rstrip("/"))
        if not folder.exists():
            return 0
        count = sum(1 for p in folder.rglob("*") if p.is_file())
        shutil.rmtree(folder, ignore_errors=True)
        return max(count, 1)  # an empty folder still was something to remove

    def sweep(self, prefix: str) -> int:
        removed = 0
        for stray in self.path(prefix.rstrip("/")).glob(f"*{TEMP_MARK}*"):
            stray.unlink(missing_ok=True)
            removed += 1
        return removed
