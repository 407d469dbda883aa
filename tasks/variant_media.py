"""Making a video's output variants from its decoded frames: WebM, an animated WebP preview, an upscale.

CPU work (PyAV and Pillow), for the post queue. The diffusers upscaler (tasks.generators.upscaler,
torch) is used only where a local directory is configured (upscale_model_dir); it is imported
then, so a post worker without one never loads torch.
"""

from __future__ import annotations

import os
from typing import Any

import av
import numpy as np
from PIL import Image

from tasks.media import EncodeError, _as_rgb, _atomic_path, _encode, encode_mp4

PREVIEW_MAX_FRAMES = 12
PREVIEW_MAX_S = 2.0
PREVIEW_MAX_WIDTH = 320
# VP9 first (every browser plays it); AV1 where the FFmpeg build lacks libvpx.
WEBM_CODECS = (
    ("libvpx-vp9", {"crf": "32", "b": "0", "deadline": "realtime", "cpu-used": "8", "row-mt": "1"}),
    ("libsvtav1", {"crf": "35", "preset": "12"}),
    ("libaom-av1", {"crf": "35", "b": "0", "cpu-used": "8"}),
)


def decode(path: str) -> tuple[np.ndarray, int]:
    """The MP4's frames as uint8 (F, H, W, 3) and its frame rate."""
    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            fps = round(float(stream.average_rate or stream.guessed_rate or 8))
            frames = [f.to_ndarray(format="rgb24") for f in container.decode(stream)]
    except av.FFmpegError as exc:
        raise EncodeError(f"decode: {exc}") from exc
    if not frames:
        raise EncodeError("the video has no frames")
    return np.stack(frames), max(1, fps)


def webm_codec() -> tuple[str, dict[str, str]]:
    """The first WebM video encoder this FFmpeg build has, with its options."""
    for name, options in WEBM_CODECS:
        if name in av.codecs_available:
            return name, options
    raise EncodeError("this FFmpeg build has no VP9 or AV1 encoder")


def write_webm(frames: np.ndarray, fps: int, path: str) -> int:
    """VP9 (or AV1) in WebM, every frame; the file's size."""
    codec, options = webm_codec()
    with _atomic_path(path) as tmp:
        _encode(tmp, "webm", codec, "yuv420p", _as_rgb(frames), fps, dict(options), {})
        return os.path.getsize(tmp)


def preview_frames(frames: np.ndarray, fps: int) -> tuple[list[Image.Image], int]:
    """At most PREVIEW_MAX_FRAMES frames spread over the first PREVIEW_MAX_S seconds, at most
    PREVIEW_MAX_WIDTH wide, and each one's display time in ms."""
    span = frames[: max(1, int(fps * PREVIEW_MAX_S))]
    step = max(1, -(-len(span) // PREVIEW_MAX_FRAMES))  # ceil: never more than the cap
    picked = span[::step][:PREVIEW_MAX_FRAMES]
    height, width = picked.shape[1:3]
    size = (width, height)
    if width > PREVIEW_MAX_WIDTH:
        size = (PREVIEW_MAX_WIDTH, max(1, round(height * PREVIEW_MAX_WIDTH / width)))
    images = [Image.fromarray(f).resize(size, Image.Resampling.LANCZOS) for f in picked]
    return images, max(20, round(1000 * step / fps))


def write_preview(frames: np.ndarray, fps: int, path: str) -> int:
    """An animated, looping WebP of the clip's start; the file's size."""
    images, duration_ms = preview_frames(frames, fps)
    with _atomic_path(path) as tmp:
        images[0].save(
            tmp, format="WEBP", save_all=True, append_images=images[1:], duration=duration_ms,
            loop=0, quality=70, method=4,
        )  # fmt: skip
        return os.path.getsize(tmp)


def upscale_frames(
    frames: np.ndarray, factor: int, *, model_dir: str = "", prompt: str = "", steps: int = 20
) -> np.ndarray:
    """Each frame `factor` times larger: the diffusers upscaler in `model_dir` if one is named
    (its own factor resampled to the asked one), else Lanczos resampling (the documented
    fallback: sharper edges, no new detail)."""
    height, width = frames.shape[1:3]
    size = (width * factor, height * factor)
    if model_dir:
        from tasks.generators import upscaler

        frames = upscaler.upscale(frames, prompt, model_dir, steps)
        if frames.shape[1:3] == (size[1], size[0]):
            return frames
    return np.stack([np.asarray(Image.fromarray(f).resize(size, Image.Resampling.LANCZOS)) for f in frames])


def write_upscaled(frames: np.ndarray, fps: int, path: str, factor: int, **model: Any) -> int:
    """The upscaled frames as H.264 MP4 (`model`: upscale_frames' model_dir, prompt, steps); its size."""
    return int(encode_mp4(upscale_frames(frames, factor, **model), fps, path)["bytes"])
