"""Device/dtype choice, CUDA OOM mapping, memory release and model-folder versions for torch adapters."""
from __future__ import annotations

import gc
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from tasks.generators.base import OutOfMemory


def pick_device() -> tuple[str, torch.dtype]:
    """CUDA in bf16 (fp16 on cards without bf16) when present, else CPU in float32."""
    if torch.cuda.is_available():
        return "cuda", torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    # Half precision on CPU is slow and lossy; float32 is the only sane CPU choice.
    return "cpu", torch.float32


def is_oom(exc: BaseException) -> bool:
    """True for CUDA allocator failures, including the RuntimeError form some kernels raise."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower()


def free_memory() -> None:
    """Drop unreachable tensors and hand cached CUDA blocks back so the next request can fit."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


@contextmanager
def map_oom() -> Iterator[None]:
    """Re-raise CUDA OOM as base.OutOfMemory (retryable), after freeing what the failed call held."""
    try:
        yield
    except Exception as exc:
        if not is_oom(exc):
            raise
        # Free before re-raising: the traceback keeps frames alive, so drop our reference first.
        msg = str(exc).splitlines()[0] if str(exc) else "CUDA out of memory"
        del exc
        free_memory()
        raise OutOfMemory(msg) from None


def dir_version(path: str, manifest: str) -> str:
    """Folder name plus a digest of its manifest file, so a swapped checkpoint gets a new version."""
    base = os.path.basename(os.path.normpath(path))
    try:
        with open(os.path.join(path, manifest), "rb") as fh:
            return f"{base}@{hashlib.sha256(fh.read()).hexdigest()[:10]}"
    except OSError:
        return base
