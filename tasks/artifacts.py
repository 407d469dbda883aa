"""Where a job's files live, and writing them atomically."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

import numpy as np

from tasks.contract.names import THUMBNAIL_NAME, VIDEO_NAME, job_dir
from tasks.media import encode_mp4, write_thumbnail


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
