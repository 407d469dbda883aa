"""Where a job's files live, and writing them atomically."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np

from tasks.contract.names import IMAGE_FORMATS, THUMBNAIL_NAME, VIDEO_NAME, image_name, job_dir
from tasks.media import encode_mp4, write_image, write_thumbnail


def write_video(root: Path, job_id: uuid.UUID, frames: np.ndarray, fps: int) -> tuple[str, int]:
    """Encode the MP4 and thumbnail (each written to a temp name, then renamed).

    Returns the video's path relative to `root` and its size. Rewriting on redelivery
    replaces the same file, so there is only ever one artifact per job.
    """
    folder = job_dir(root, job_id)
    folder.mkdir(parents=True, exist_ok=True)
    write_thumbnail(frames[len(frames) // 2], str(folder / THUMBNAIL_NAME))
    info = encode_mp4(frames, fps, str(folder / VIDEO_NAME))
    return f"{job_id}/{VIDEO_NAME}", int(info["bytes"])


def write_images(root: Path, job_id: uuid.UUID, images: np.ndarray) -> tuple[str, int]:
    """Write each uint8 (H, W, 3) image of `images` as PNG and WebP, and a thumbnail of the first
    (each to a temp name, then renamed).

    Returns the first PNG's path relative to `root` (the job's artifact_path) and the size of all
    the images' files. A redelivery rewrites the same names.
    """
    folder = job_dir(root, job_id)
    folder.mkdir(parents=True, exist_ok=True)
    write_thumbnail(images[0], str(folder / THUMBNAIL_NAME))
    size = 0
    for index, image in enumerate(images):
        for fmt in IMAGE_FORMATS:
            size += write_image(image, str(folder / image_name(index, fmt)), fmt)
    return f"{job_id}/{image_name(0)}", size


def remove_job_dir(root: Path, job_id: uuid.UUID) -> bool:
    """Compensation: drop everything the job wrote, finished or partial (idempotent).

    Returns whether there was anything to remove.
    """
    folder = job_dir(root, job_id)
    existed = folder.exists()
    shutil.rmtree(folder, ignore_errors=True)
    return existed


def sweep_temp(root: Path, job_id: uuid.UUID) -> int:
    """Remove temp files an attempt killed mid-write left beside the finished artifacts."""
    removed = 0
    for stray in job_dir(root, job_id).glob("*.tmp-*"):
        stray.unlink(missing_ok=True)
        removed += 1
    return removed
