"""Generic adapter for a local diffusers text-to-image pipeline folder (e.g. Sana_600M_1024px_diffusers)."""

from __future__ import annotations

import inspect
import logging
import os
import secrets
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import torch
from diffusers import DiffusionPipeline

from tasks.generators.base import (
    CancelCheck,
    Canceled,
    ImageGenerator,
    ImageRequest,
    ImageResult,
    StepCallback,
)
from tasks.generators.device import dir_version, map_oom, pick_device
from tasks.generators.diffusers_video import DiffusersVideoGenerator, to_uint8_frames
from tasks.generators.library_logs import quiet_model_libraries

log = logging.getLogger(__name__)

# What every 8x-VAE family with 2x2 patches (SD3, Flux, PixArt) needs; Sana's DC-AE needs 32.
MIN_SIDE_MULTIPLE = 16


def image_seeds(request: ImageRequest) -> list[int]:
    """One seed per image: seed + k for image k, so image k is the same alone, batched or as
    part of a larger num_images (a request without a seed draws one)."""
    base = request.seed if request.seed is not None else secrets.randbits(32)
    return [base + k for k in range(request.num_images)]


class DiffusersImageGenerator(ImageGenerator):
    """Any local diffusers text-to-image pipeline; same-shaped requests share one batched call.

    Each request's num_images become rows of that call, each row with its own CPU generator
    (image_seeds), so the rows do not depend on their batch-mates beyond float rounding.
    """

    max_rows = 8  # images per pipeline call; a request's images are never split across calls
    call_kwargs: ClassVar[dict[str, Any]] = {}  # extra pipeline arguments a subclass fixes

    def __init__(self, path: str | None = None):
        self.path = path
        self.name = os.path.basename(os.path.normpath(path)) if path else type(self).__name__
        self.version = dir_version(path, "model_index.json") if path else self.name
        self.device, self.dtype = pick_device()
        self.pipe: Any = None
        self._call_args: frozenset[str] = frozenset()

    # -- loading ---------------------------------------------------------------------------------
    def _build_pipeline(self) -> Any:
        """Subclasses override this to assemble a pipeline in memory; the rest is shared."""
        if not self.path:
            raise ValueError("DiffusersImageGenerator needs a pipeline folder")
        return DiffusionPipeline.from_pretrained(self.path, local_files_only=True, dtype=self.dtype)

    def load(self) -> None:
        quiet_model_libraries()
        pipe = self._build_pipeline()
        pipe.to(self.device)
        pipe.set_progress_bar_config(disable=True)
        self.pipe = pipe
        self._call_args = frozenset(inspect.signature(pipe.__call__).parameters)
        spatial, _ = DiffusersVideoGenerator._constraints(pipe)
        self.spatial_multiple = spatial if spatial >= 32 else max(spatial, MIN_SIDE_MULTIPLE)
        m = self.spatial_multiple  # warm-up at the smallest legal shape
        self.generate([ImageRequest("warm up", width=m, height=m, steps=1, seed=0, guidance_scale=1.0)])

    # -- generation ------------------------------------------------------------------------------
    def ready(self) -> bool:
        return self.pipe is not None

    def run_batch(
        self,
        requests: Sequence[ImageRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[ImageResult]:
        """Checked requests of the same shape run as one call of up to max_rows images.

        on_step(index, step, total) after every denoising step; a cancel raises base.Canceled
        for the whole call, OOM base.OutOfMemory.
        """
        results: list[ImageResult | None] = [None] * len(requests)
        groups: dict[tuple[Any, ...], list[int]] = {}
        for idx, req in enumerate(requests):
            groups.setdefault((req.width, req.height, req.steps, req.guidance_scale), []).append(idx)
        for indices in groups.values():
            chunk: list[int] = []
            for idx in [*indices, -1]:  # -1 flushes the last chunk
                rows = sum(requests[i].num_images for i in chunk)
                if chunk and (idx < 0 or rows + requests[idx].num_images > self.max_rows):
                    done = self._run_group(chunk, requests, on_step, should_cancel)
                    for i, res in zip(chunk, done, strict=True):
                        results[i] = res
                    chunk = []
                if idx >= 0:
                    chunk.append(idx)
        return [r for r in results if r is not None]

    def _run_group(
        self,
        indices: list[int],
        requests: Sequence[ImageRequest],
        on_step: StepCallback | None,
        should_cancel: CancelCheck | None,
    ) -> list[ImageResult]:
        reqs = [requests[i] for i in indices]
        first = reqs[0]
        if should_cancel is not None and should_cancel():
            raise Canceled("image generation canceled")
        seeds = [image_seeds(r) for r in reqs]
        prompts = [r.prompt for r, s in zip(reqs, seeds, strict=True) for _ in s]
        gens = [torch.Generator(device="cpu").manual_seed(s) for row in seeds for s in row]

        def stepped(i: int) -> dict[str, Any]:
            if on_step is not None:
                for idx in indices:
                    on_step(idx, i + 1, first.steps)
            if should_cancel is not None and should_cancel():
                raise Canceled("image generation canceled")  # unwinds out of the pipeline, skips decode
            return {}  # callback_on_step_end: no tensors replaced

        kwargs: dict[str, Any] = dict(self.call_kwargs)
        if "callback_on_step_end" in self._call_args:
            kwargs["callback_on_step_end"] = lambda pipe, i, t, kw: stepped(i)
        elif "callback" in self._call_args:  # older pipelines (PixArt)
            kwargs |= {"callback": lambda i, t, latents: stepped(i), "callback_steps": 1}
        if "use_resolution_binning" in self._call_args:
            kwargs["use_resolution_binning"] = False  # the size asked for, not the nearest trained one
        started = time.perf_counter()
        with map_oom(), torch.inference_mode():
            out = self.pipe(
                prompt=prompts,
                height=first.height,
                width=first.width,
                num_inference_steps=first.steps,
                guidance_scale=first.guidance_scale,
                generator=gens,
                output_type="np",
                **kwargs,
            )
        seconds = time.perf_counter() - started
        images = to_uint8_frames(out.images if hasattr(out, "images") else out[0])
        results, row = [], 0
        for r, s in zip(reqs, seeds, strict=True):
            extra = {"seed": s[0], "batch": len(prompts)}
            results.append(ImageResult(images=images[row : row + r.num_images], seconds=seconds, extra=extra))
            row += r.num_images
        return results
