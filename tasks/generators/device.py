"""Device/dtype choice, CUDA OOM mapping, memory release and model-folder versions for torch adapters."""
from __future__ import annotations

import gc
import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from tasks.generators.base import OutOfMemory

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def pick_device(dtype: str = "auto") -> tuple[str, torch.dtype]:
    """CUDA when present, else CPU; `dtype` "auto" or a name in DTYPES.

    auto: bf16 on CUDA (fp16 on cards without bf16), float32 on CPU. On CPUs with AMX, bf16
    makes a batched text generate() ~1.3x faster but one request alone ~1.2x slower, and its
    rounding lets a row's greedy text depend on its batch-mates: opt in (GENQUEUE_TEXT_DTYPE).
    """
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if dtype != "auto":
        if dtype not in DTYPES:
            raise ValueError(f"unknown dtype {dtype!r}; use auto or one of {', '.join(DTYPES)}")
        return device, DTYPES[dtype]
    if device == "cuda":
        return device, torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    return device, torch.float32


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
