"""Storyboard output: shot MP4s joined into one MP4 (the shared H.264 encoder), a contact sheet, a probe."""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from typing import Any

import av
import numpy as np

from tasks.media import EncodeError, _atomic_path, encode_h264

SHEET_COLUMNS = 4  # tiles per row of the contact sheet


def _frames(path: str) -> Iterator[np.ndarray]:
    """Decode one MP4's video frames as uint8 (H, W, 3) rgb24, one at a time."""
    try:
        with av.open(path) as container:
            for frame in container.decode(video=0):
                yield frame.to_ndarray(format="rgb24")
    except av.FFmpegError as exc:
        raise EncodeError(f"{path}: {exc}") from exc


def probe_mp4(path: str) -> dict[str, Any]:
    """frames (decoded and counted, not the header's guess), fps, width, height and duration_s."""
    try:
        with av.open(path) as container:
            stream = container.streams.video[0]
            rate = stream.average_rate or stream.base_rate
            fps = float(rate) if rate else 0.0
            width, height = stream.codec_context.width, stream.codec_context.height
            frames = sum(1 for _ in container.decode(video=0))
    except av.FFmpegError as exc:
        raise EncodeError(f"{path}: {exc}") from exc
    duration = frames / fps if fps else 0.0
    return {"frames": frames, "fps": fps, "width": width, "height": height, "duration_s": duration}


def stitch_mp4(inputs: Sequence[str], path: str, fps: int) -> dict[str, int]:
    """Re-encode the shots' frames, in order, into one H.264 MP4 at `path`, written atomically.

    Frames stream from decoder to encoder, so only one frame is held at a time. A shot of another
    size than the first, or with no frames, is a ValueError (and nothing is written).
    """
    if not inputs:
        raise ValueError("no shots to stitch")
    size: tuple[int, int] | None = None
    total = 0

    def frames() -> Iterator[np.ndarray]:
        nonlocal size, total
        for index, shot in enumerate(inputs):
            count = 0
            for frame in _frames(shot):
                shape = (frame.shape[1], frame.shape[0])
                if size is None:
                    size = shape
                elif shape != size:
                    raise ValueError(
                        f"shot {index} ({shot}) is {shape[0]}x{shape[1]}, the first is {size[0]}x{size[1]}"
                    )
                count += 1
                yield frame
            if count == 0:
                raise ValueError(f"shot {index} ({shot}) has no frames")
            total += count

    with _atomic_path(path) as tmp:
        encode_h264(tmp, frames(), fps)
        nbytes = os.path.getsize(tmp)
    assert size is not None  # frames() raised otherwise
    return {"frames": total, "bytes": nbytes, "width": size[0], "height": size[1]}


def _middle_frame(path: str) -> np.ndarray:
    # Two passes (count, then decode to the middle) keep one frame in memory, not the whole shot.
    count = probe_mp4(path)["frames"]
    if count == 0:
        raise ValueError(f"{path} has no frames")
    for index, frame in enumerate(_frames(path)):
        if index == count // 2:
            return frame
    raise ValueError(f"{path} has fewer frames on the second pass")  # pragma: no cover


def contact_sheet(inputs: Sequence[str], path: str, tile_width: int = 256) -> dict[str, int]:
    """Each shot's middle frame, scaled to `tile_width` (aspect kept), up to four a row, as JPEG."""
    from PIL import Image

    if not inputs:
        raise ValueError("no shots for a contact sheet")
    if tile_width < 1:
        raise ValueError(f"tile_width must be >= 1, got {tile_width}")
    tiles = []
    for shot in inputs:
        frame = _middle_frame(shot)
        height = max(1, round(frame.shape[0] * tile_width / frame.shape[1]))
        tiles.append(Image.fromarray(frame, "RGB").resize((tile_width, height), Image.Resampling.LANCZOS))
    columns = min(SHEET_COLUMNS, len(tiles))
    rows = math.ceil(len(tiles) / columns)
    row_height = max(tile.height for tile in tiles)
    sheet = Image.new("RGB", (columns * tile_width, rows * row_height))
    for index, tile in enumerate(tiles):
        sheet.paste(tile, ((index % columns) * tile_width, (index // columns) * row_height))
    with _atomic_path(path) as tmp:
        try:
            sheet.save(tmp, format="JPEG", quality=90)
        except OSError as exc:
            raise EncodeError(f"jpeg: {exc}") from exc
        nbytes = os.path.getsize(tmp)
    return {"bytes": nbytes, "width": sheet.width, "height": sheet.height}
