"""Video/thumbnail encoding with imageio-ffmpeg's bundled ffmpeg, written atomically (temp file + rename)."""
from __future__ import annotations

import functools
import os
import secrets
import subprocess
from collections.abc import Iterator
from contextlib import contextmanager

import imageio_ffmpeg
import numpy as np

ENCODE_TIMEOUT_S = 600


class EncodeError(RuntimeError):
    """ffmpeg failed; the message carries the tail of its stderr."""


@functools.cache
def _ffmpeg() -> str:
    return imageio_ffmpeg.get_ffmpeg_exe()  # looked up on first use, not at import


@contextmanager
def _atomic_path(path: str) -> Iterator[str]:
    """Yield a temp name beside `path`; on success rename it over `path`, else remove it."""
    tmp = f"{path}.tmp-{secrets.token_hex(6)}"
    try:
        yield tmp
        os.replace(tmp, path)  # same directory, so readers see the old file or the whole new one
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _as_rgb(frames: np.ndarray) -> np.ndarray:
    arr = np.asarray(frames)
    if arr.ndim == 3:
        arr = arr[None]
    if arr.ndim != 4 or arr.shape[-1] != 3 or 0 in arr.shape:
        raise ValueError(f"frames must be a non-empty (F, H, W, 3) array, got shape {arr.shape}")
    if arr.dtype != np.uint8:
        raise ValueError(f"frames must be uint8, got {arr.dtype}")
    # yuv420p halves chroma resolution, so H.264 needs even sides: replicate the last row/column.
    pad_h, pad_w = arr.shape[1] % 2, arr.shape[2] % 2
    if pad_h or pad_w:
        arr = np.pad(arr, ((0, 0), (0, pad_h), (0, pad_w), (0, 0)), mode="edge")
    return np.ascontiguousarray(arr)


def _run(cmd: list[str], data: bytes) -> None:
    proc = subprocess.run(cmd, input=data, capture_output=True, timeout=ENCODE_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        tail = proc.stderr.decode(errors="replace").strip()[-2000:]
        raise EncodeError(f"ffmpeg exited with {proc.returncode}: {tail}")


def encode_mp4(frames: np.ndarray, fps: int, path: str, crf: int = 20) -> dict[str, int]:
    """Write uint8 (F, H, W, 3) frames as H.264/yuv420p MP4 with the index up front (+faststart)."""
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")
    arr = _as_rgb(frames)
    count, height, width = arr.shape[:3]
    cmd = [
        _ffmpeg(), "-hide_banner", "-loglevel", "error", "-y",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-r", str(fps), "-i", "-",
        "-an", "-c:v", "libx264", "-preset", "veryfast", "-crf", str(crf), "-pix_fmt", "yuv420p",
        "-movflags", "+faststart", "-f", "mp4",
    ]  # fmt: skip
    with _atomic_path(path) as tmp:
        _run([*cmd, tmp], arr.tobytes())
        size = os.path.getsize(tmp)
    return {"bytes": size, "frames": count, "width": width, "height": height, "fps": fps}


def write_thumbnail(frame: np.ndarray, path: str) -> dict[str, int]:
    """Write one uint8 (H, W, 3) frame as PNG, or JPEG when `path` ends in .jpg/.jpeg."""
    arr = np.asarray(frame)
    if arr.ndim != 3 or arr.shape[-1] != 3 or arr.dtype != np.uint8 or 0 in arr.shape:
        raise ValueError(f"frame must be a non-empty uint8 (H, W, 3) array, got {arr.dtype} {arr.shape}")
    height, width = arr.shape[:2]
    jpeg = path.lower().endswith((".jpg", ".jpeg"))
    codec = ["-c:v", "mjpeg", "-q:v", "3", "-pix_fmt", "yuvj444p"] if jpeg else ["-c:v", "png"]
    cmd = [
        _ffmpeg(), "-hide_banner", "-loglevel", "error", "-y",
        "-f", "rawvideo", "-pix_fmt", "rgb24", "-s", f"{width}x{height}", "-i", "-",
        "-frames:v", "1", *codec, "-f", "image2", "-update", "1",
    ]  # fmt: skip
    with _atomic_path(path) as tmp:
        _run([*cmd, tmp], np.ascontiguousarray(arr).tobytes())
        size = os.path.getsize(tmp)
    return {"bytes": size, "width": width, "height": height}
