"""Zero-cost "echo" generators for tests and benchmarks: deterministic output, failure markers, no torch."""
from __future__ import annotations

import hashlib
import math
import os
import time
from collections.abc import Sequence

import numpy as np

from tasks.generators.base import (
    CancelCheck,
    Canceled,
    InvalidRequest,
    StepCallback,
    TextRequest,
    TextResult,
    TransientGeneratorError,
    VideoRequest,
    VideoResult,
)

# Markers a test puts in a prompt to drive the failure paths.
FAIL = "[[fail]]"  # this request alone fails with InvalidRequest
TRANSIENT = "[[transient]]"  # the whole call raises TransientGeneratorError (retryable)

EMPTY = np.zeros((0, 0, 0, 3), dtype=np.uint8)


def _check_markers(prompt: str) -> None:
    if TRANSIENT in prompt:
        raise TransientGeneratorError("echo: transient failure requested by prompt marker")


class EchoTextGenerator:
    """Returns "Shot: <prompt>" cut to max_new_tokens words, instantly."""

    name = "echo"
    version = "echo-text@1"
    device = "cpu"

    def load(self) -> None:
        pass

    def generate(
        self, requests: Sequence[TextRequest], should_cancel: CancelCheck | None = None
    ) -> list[TextResult]:
        for req in requests:
            _check_markers(req.prompt)
        if should_cancel is not None and should_cancel():
            raise Canceled("text generation canceled")
        results = []
        for req in requests:
            started = time.perf_counter()
            if not req.prompt.strip():
                results.append(TextResult("", 0, 0.0, error=InvalidRequest("prompt is empty")))
            elif FAIL in req.prompt:
                err = InvalidRequest("echo: failure requested by prompt")
                results.append(TextResult("", 0, 0.0, error=err))
            else:
                words = ("Shot: " + req.prompt.strip()).split()[: max(req.max_new_tokens, 1)]
                results.append(TextResult(" ".join(words), len(words), time.perf_counter() - started))
        return results


def colour_for(prompt: str, seed: int | None) -> tuple[int, int, int]:
    """A stable RGB colour per (prompt, seed), so tests can tell outputs apart and compare reruns."""
    digest = hashlib.sha256(f"{prompt}\0{seed}".encode()).digest()
    return digest[0], digest[1], digest[2]


def check_video_request(
    req: VideoRequest, multiple: int, frame_step: int, max_side: int, max_frames: int, max_steps: int = 200
) -> None:
    """Raise InvalidRequest (message fit for API clients) unless sides are multiples of `multiple`
    and num_frames is frame_step*k+1. Shared by every video adapter; it lives here because this
    module is torch-free."""
    if not isinstance(req.prompt, str) or not req.prompt.strip():
        raise InvalidRequest("prompt is empty")
    for side, value in (("width", req.width), ("height", req.height)):
        if value <= 0 or value % multiple or value > max_side:
            raise InvalidRequest(
                f"{side} must be a positive multiple of {multiple} up to {max_side}, got {value}"
            )
    if req.num_frames < 1 or (req.num_frames - 1) % frame_step or req.num_frames > max_frames:
        example = frame_step * 4 + 1
        raise InvalidRequest(
            f"num_frames must be {frame_step}*k+1 (e.g. {example}) up to {max_frames}, got {req.num_frames}"
        )
    if not 1 <= req.steps <= max_steps:
        raise InvalidRequest(f"steps must be between 1 and {max_steps}, got {req.steps}")
    if req.fps < 1:
        raise InvalidRequest(f"fps must be >= 1, got {req.fps}")
    if not (req.guidance_scale >= 0 and math.isfinite(req.guidance_scale)):
        raise InvalidRequest("guidance_scale must be a finite number >= 0")


class EchoVideoGenerator:
    """Solid-colour frames of the requested size, with Wan's size rules so tests see real rejections.

    GENQUEUE_ECHO_STEP_SECONDS (default 0) sleeps that long per step, so kill/cancel tests can
    catch a task mid-run.
    """

    name = "echo"
    version = "echo-video@1"
    device = "cpu"
    spatial_multiple = 16
    temporal_multiple = 4
    max_side = 2048
    max_frames = 257

    def load(self) -> None:
        pass

    def validate(self, req: VideoRequest) -> None:
        if FAIL in req.prompt:
            raise InvalidRequest("echo: failure requested by prompt")
        check_video_request(
            req, self.spatial_multiple, self.temporal_multiple, self.max_side, self.max_frames
        )

    def generate(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        for req in requests:
            _check_markers(req.prompt)
        step_s = float(os.environ.get("GENQUEUE_ECHO_STEP_SECONDS") or 0)
        results = []
        for idx, req in enumerate(requests):
            try:
                self.validate(req)
            except InvalidRequest as exc:
                results.append(VideoResult(frames=EMPTY, fps=req.fps, seconds=0.0, error=exc))
                continue
            started = time.perf_counter()
            for step in range(1, req.steps + 1):
                if should_cancel is not None and should_cancel():
                    raise Canceled("video generation canceled")
                if step_s > 0:
                    time.sleep(step_s)
                if on_step is not None:
                    on_step(idx, step, req.steps)
            frames = np.empty((req.num_frames, req.height, req.width, 3), dtype=np.uint8)
            frames[...] = colour_for(req.prompt, req.seed)
            extra = {"seed": req.seed, "batch": 1}
            results.append(VideoResult(frames, req.fps, time.perf_counter() - started, extra=extra))
        return results
