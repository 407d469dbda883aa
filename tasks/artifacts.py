"""A job's files in the artifact storage: written whole (never a partial object), removed, swept."""

from __future__ import annotations

import uuid

import numpy as np

from models.storage import Storage
from tasks.contract.names import (
    IMAGE_FORMATS,
    IMAGE_MIMETYPES,
    THUMBNAIL_NAME,
    VIDEO_NAME,
    artifact_key,
    image_name,
    job_prefix,
)
from tasks.media import encode_mp4, write_image, write_thumbnail


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


def write_images(storage: Storage, job_id: uuid.UUID, images: np.ndarray) -> tuple[str, int]:
    """Write each uint8 (H, W, 3) image of `images` as PNG and WebP, and a thumbnail of the first,
    each published whole under its job's fixed key.

    Returns the first PNG's key (the job's artifact_path) and the size of all the images' files.
    A redelivery rewrites the same objects. As with a video, the artifact_path's object goes last:
    once it exists, every image and the thumbnail do.
    """
    with storage.writing(artifact_key(job_id, THUMBNAIL_NAME), "image/jpeg") as path:
        write_thumbnail(images[0], str(path))
    files = [(index, fmt) for index in range(len(images)) for fmt in IMAGE_FORMATS]
    files.sort(key=lambda f: f == (0, "png"))  # stable: the first PNG last, the rest in order
    size = 0
    for index, fmt in files:
        with storage.writing(artifact_key(job_id, image_name(index, fmt)), IMAGE_MIMETYPES[fmt]) as path:
            size += write_image(images[index], str(path), fmt)
    return artifact_key(job_id, image_name(0)), size


def remove_job_dir(storage: Storage, job_id: uuid.UUID) -> bool:
    """Compensation, retention, DELETE: drop everything the job wrote, finished or partial
    (idempotent). Returns whether there was anything to remove."""
    return storage.delete_prefix(job_prefix(job_id)) > 0


def sweep_temp(storage: Storage, job_id: uuid.UUID) -> int:
    """Discard what an attempt killed mid-write left beside the finished artifacts."""
    return storage.sweep(job_prefix(job_id))
