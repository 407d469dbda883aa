"""Generic adapter for a local diffusers text-to-video pipeline folder (e.g. Wan2.1-T2V-1.3B-Diffusers)."""
from __future__ import annotations

import json
import logging
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from diffusers import DiffusionPipeline

from tasks.generators.base import (
    CancelCheck,
    Canceled,
    StepCallback,
    VideoGenerator,
    VideoRequest,
    VideoResult,
)
from tasks.generators.device import dir_version, map_oom, pick_device
from tasks.generators.library_logs import quiet_model_libraries

log = logging.getLogger(__name__)


def to_uint8_frames(video: Any) -> np.ndarray:
    """One pipeline output video (array in [0, 1], uint8, or a list of PIL frames) as uint8 (F, H, W, 3)."""
    if isinstance(video, list | tuple):
        video = np.stack([np.asarray(f) for f in video])
    arr = video.float().cpu().numpy() if isinstance(video, torch.Tensor) else np.asarray(video)
    if arr.ndim == 4 and arr.shape[-1] not in (1, 3) and arr.shape[1] in (1, 3):
        arr = arr.transpose(0, 2, 3, 1)  # (F, C, H, W) -> (F, H, W, C)
    if arr.dtype != np.uint8:
        arr = (np.clip(arr, 0.0, 1.0) * 255.0).round().astype(np.uint8)
    if arr.shape[-1] == 1:
        arr = np.repeat(arr, 3, axis=-1)
    return np.ascontiguousarray(arr)


class DiffusersVideoGenerator(VideoGenerator):
    """Any local diffusers text-to-video pipeline; same-shaped requests share one batched call.

    Size rules are the base class's, with `spatial_multiple`/`temporal_multiple` read from the
    pipeline in load() (VAE scale times patch size), so check_inputs matches the loaded model.
    """

    max_batch = 4  # prompts per pipeline call; bigger batches buy little once the GPU is busy

    def __init__(self, path: str | None = None):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path)) if path else type(self).__name__
        self.version = dir_version(path, "model_index.json") if path else self.name
        self.device, self.dtype = pick_device()
        self.pipe: Any = None

    # -- loading ---------------------------------------------------------------------------------
    def _build_pipeline(self) -> Any:
        """Subclasses override this to assemble a pipeline in memory; the rest is shared."""
        if not self.path:
            raise ValueError("DiffusersVideoGenerator needs a pipeline folder")
        dtype: Any = self.dtype
        try:
            with open(os.path.join(self.path, "model_index.json")) as fh:
                cls = json.load(fh).get("_class_name", "")
        except (OSError, ValueError):
            cls = ""
        if cls.startswith("Wan"):
            dtype = {"default": self.dtype, "vae": torch.float32}  # Wan's VAE decodes worse in half precision
        return DiffusionPipeline.from_pretrained(self.path, local_files_only=True, dtype=dtype)

    def load(self) -> None:
        quiet_model_libraries()  # no loading bars in the logs
        pipe = self._build_pipeline()
        pipe.to(self.device)
        pipe.set_progress_bar_config(disable=True)
        self.pipe = pipe
        self.spatial_multiple, self.temporal_multiple = self._constraints(pipe)
        # Warm-up at the smallest legal shape: pays kernel selection/allocation before the first job.
        m, t = self.spatial_multiple, self.temporal_multiple
        self.generate([VideoRequest("warm up", width=m, height=m, num_frames=t + 1, steps=1, seed=0)])

    @staticmethod
    def _constraints(pipe: Any) -> tuple[int, int]:
        """(width/height multiple, frame-count step): VAE downscale times the transformer patch size."""
        vae_scale = getattr(pipe, "vae_scale_factor_spatial", None) or getattr(pipe, "vae_scale_factor", None)
        spatial = int(vae_scale or 8)
        patch = getattr(getattr(getattr(pipe, "transformer", None), "config", None), "patch_size", None)
        if isinstance(patch, list | tuple) and len(patch) == 3:
            spatial *= int(patch[1])  # (t, h, w) patches, e.g. Wan's (1, 2, 2)
        elif isinstance(patch, int):
            spatial *= patch
        temporal: Any = getattr(pipe, "vae_scale_factor_temporal", 1) or 1
        temporal = int(temporal)
        return int(spatial), temporal

    # -- generation ------------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.pipe is not None

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        """Checked requests of the same shape run as one batched call (up to max_batch prompts).

        on_step(index, step, total) is called after every denoising step with step in 1..total.
        A cancel raises base.Canceled for the whole call; OOM raises base.OutOfMemory.
        Each request keeps its own seed inside a batch. A batched result equals the single-request
        one up to rounding in float32 (CPU); in bf16 on CUDA batched kernels round differently and
        the frames can visibly differ, so reproducing a video exactly means the same batch shape.
        """
        results: list[VideoResult | None] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for idx, req in enumerate(requests):
            key = (req.width, req.height, req.num_frames, req.steps, req.guidance_scale)
            groups.setdefault(key, []).append(idx)
        for indices in groups.values():
            for start in range(0, len(indices), self.max_batch):
                chunk = indices[start : start + self.max_batch]
                done = self._run_group(chunk, requests, on_step, should_cancel)
                for idx, res in zip(chunk, done, strict=True):
                    results[idx] = res
        return [r for r in results if r is not None]

    def _run_group(
        self,
        indices: list[int],
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None,
        should_cancel: CancelCheck | None,
    ) -> list[VideoResult]:
        reqs = [requests[i] for i in indices]
        first = reqs[0]
        if should_cancel is not None and should_cancel():
            raise Canceled("video generation canceled")
        seeds = [r.seed if r.seed is not None else secrets.randbits(63) for r in reqs]
        # CPU generators: the same seed gives the same starting noise on every device.
        gens = [torch.Generator(device="cpu").manual_seed(s) for s in seeds]

        def step_end(pipe: Any, i: int, t: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
            if on_step is not None:
                for idx in indices:
                    on_step(idx, i + 1, first.steps)
            if should_cancel is not None and should_cancel():
                raise Canceled("video generation canceled")  # unwinds out of the pipeline, skips decode
            return {}

        started = time.perf_counter()
        with map_oom(), torch.inference_mode():
            out = self.pipe(
                prompt=[r.prompt for r in reqs],
                height=first.height,
                width=first.width,
                num_frames=first.num_frames,
                num_inference_steps=first.steps,
                guidance_scale=first.guidance_scale,
                generator=gens,
                output_type="np",
                callback_on_step_end=step_end,
            )
        seconds = time.perf_counter() - started
        videos = out.frames if hasattr(out, "frames") else out[0]
        return [
            VideoResult(
                frames=to_uint8_frames(videos[k]),
                fps=r.fps,
                seconds=seconds,
                extra={"seed": seeds[k], "batch": len(reqs)},
            )
            for k, r in enumerate(reqs)
        ]
