"""A job's files in the artifact storage: written whole (never a partial object), removed, swept."""

from __future__ import annotations

import uuid

import numpy as np

from models.storage import Storage
from tasks.contract.names import THUMBNAIL_NAME, VIDEO_NAME, artifact_key, job_prefix
from tasks.media import encode_mp4, write_thumbnail


def write_video(storage: Storage, job_id: uuid.UUID, frames: np.ndarray, fps: int) -> tuple[str, int]:
    """Encode the MP4 and thumbnail, each published whole under its job's fixed key.

    Returns the video's key (the job's artifact_path) and its size. Rewriting on redelivery
    replaces the same objects, so there is only ever one artifact per job. The thumbnail goes
    first: once the video exists, everything a download may ask for does.
    """
    with storage.writing(artifact_key(job_id, THUMBNAIL_NAME), "image/jpeg") as path:
        write_thumbnail(frames[len(frames) // 2], str(path))
    key = artifact_key(job_id, VIDEO_NAME)
    with storage.writing(key, "video/mp4") as path:
        info = encode_mp4(frames, fps, str(path))
    return key, int(info["bytes"])


def remove_job_dir(storage: Storage, job_id: uuid.UUID) -> bool:
    """Compensation, retention, DELETE: drop everything the job wrote, finished or partial
    (idempotent). Returns whether there was anything to remove."""
    return storage.delete_prefix(job_prefix(job_id)) > 0


def sweep_temp(storage: Storage, job_id: uuid.UUID) -> int:
    """Discard what an attempt killed mid-write left beside the finished artifacts."""
    return storage.sweep(job_prefix(job_id))
