"""Video/thumbnail encoding in process with PyAV (FFmpeg's libraries), images with Pillow, written atomically
(temp + rename)."""
from __future__ import annotations

import os
import secrets
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import Any

import av
import numpy as np


class EncodeError(RuntimeError):
    """FFmpeg refused the frames or could not write the file."""


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


def _encode(
    path: str, fmt: str, codec: str, pix_fmt: str, frames: Iterable[np.ndarray], rate: int,
    stream_options: dict[str, str], container_options: dict[str, str],
) -> None:  # fmt: skip
    """Encode rgb24 (H, W, 3) frames, all one size, into one stream of a new container at `path`.

    `frames` may be a generator (the stitch streams decoded shots through it); the stream takes its
    size from the first frame.
    """
    try:
        with av.open(path, "w", format=fmt, options=container_options) as out:
            stream: Any = None
            for frame in frames:
                if stream is None:
                    stream = out.add_stream(codec, rate=rate)
                    stream.width, stream.height = frame.shape[1], frame.shape[0]
                    stream.pix_fmt = pix_fmt
                    stream.options = stream_options
                out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
            if stream is None:
                raise ValueError("no frames to encode")
            out.mux(stream.encode())  # flush the encoder's delayed frames
    except av.FFmpegError as exc:
        raise EncodeError(f"{codec}: {exc}") from exc


# Up to this many pixels in a clip (frames x height x width: 256x256, 32 frames) x264 encodes on
# one thread: starting its thread pool cost more CPU than such a clip's encode (64x64, 9 frames:
# 3.8 -> 2.6 ms, the same bytes). Larger clips keep x264's threads, for their wall time.
ONE_THREAD_PIXELS = 256 * 256 * 32


def encode_h264(
    path: str, frames: Iterable[np.ndarray], fps: int, crf: int = 20, one_thread: bool = False
) -> None:
    """Encode even-sided uint8 (H, W, 3) frames as H.264/yuv420p MP4 at `path` (not atomic: callers
    pass a temp name); the one encoder setup that encode_mp4 and the storyboard stitch share.
    `one_thread`: no x264 thread pool (a small clip, ONE_THREAD_PIXELS)."""
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")
    options = {"crf": str(crf), "preset": "veryfast"} | ({"threads": "1"} if one_thread else {})
    _encode(path, "mp4", "libx264", "yuv420p", frames, fps, options, {"movflags": "+faststart"})


def encode_mp4(frames: np.ndarray, fps: int, path: str, crf: int = 20) -> dict[str, int]:
    """Write uint8 (F, H, W, 3) frames as H.264/yuv420p MP4 with the index up front (+faststart).

    In process: no ffmpeg launch per job (a launch cost ~35 ms of CPU, more than a small clip).
    """
    if fps < 1:
        raise ValueError(f"fps must be >= 1, got {fps}")
    arr = _as_rgb(frames)
    count, height, width = arr.shape[:3]
    with _atomic_path(path) as tmp:
        encode_h264(tmp, arr, fps, crf, one_thread=count * height * width <= ONE_THREAD_PIXELS)
        size = os.path.getsize(tmp)
    return {"bytes": size, "frames": count, "width": width, "height": height, "fps": fps}


def write_thumbnail(frame: np.ndarray, path: str) -> dict[str, int]:
    """Write one uint8 (H, W, 3) frame as PNG, or JPEG when `path` ends in .jpg/.jpeg.

    With Pillow (write_image), not an FFmpeg container: 3-4x less CPU per JPEG (1.0 -> 0.27 ms at
    64x64, 36 -> 12 ms at 1280x720, noise frames), a cost every video and image job pays.
    """
    arr = np.asarray(frame)
    if arr.ndim != 3 or arr.shape[-1] != 3 or arr.dtype != np.uint8 or 0 in arr.shape:
        raise ValueError(f"frame must be a non-empty uint8 (H, W, 3) array, got {arr.dtype} {arr.shape}")
    height, width = arr.shape[:2]
    jpeg = path.lower().endswith((".jpg", ".jpeg"))
    size = write_image(arr, path, "jpeg" if jpeg else "png")
    return {"bytes": size, "width": width, "height": height}


# Lossless WebP (method 4: the encoder's default speed) keeps the PNG's pixels exactly. JPEG
# (thumbnails): full-resolution chroma (4:4:4), as the FFmpeg MJPEG thumbnails had, at quality 75:
# their error on a smooth 832x480 frame (2.24 against 2.30 mean per channel) at about their size
# (86 against 76 KB; quality 90 doubled it), and smaller on noisy frames (28 against 104 KB).
_IMAGE_OPTIONS: dict[str, dict[str, Any]] = {
    "png": {"optimize": False},
    "webp": {"lossless": True, "method": 4},
    "jpeg": {"quality": 75, "subsampling": 0},
}


def write_image(image: np.ndarray, path: str, fmt: str) -> int:
    """Write one uint8 (H, W, 3) image as PNG, WebP or JPEG (`fmt`); returns its size in bytes.

    Pillow writes no timestamp into these formats, so the same pixels give the same bytes.
    """
    from PIL import Image

    arr = np.asarray(image)
    if arr.ndim != 3 or arr.shape[-1] != 3 or arr.dtype != np.uint8 or 0 in arr.shape:
        raise ValueError(f"image must be a non-empty uint8 (H, W, 3) array, got {arr.dtype} {arr.shape}")
    with _atomic_path(path) as tmp:
        try:
            picture = Image.fromarray(np.ascontiguousarray(arr), "RGB")
            picture.save(tmp, format=fmt.upper(), **_IMAGE_OPTIONS[fmt])
        except OSError as exc:
            raise EncodeError(f"{fmt}: {exc}") from exc
        size = os.path.getsize(tmp)
    return size
