"""Zero-cost "echo" generators for tests and benchmarks: deterministic output, failure markers, no torch."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import numpy as np

from models.settings import from_environment
from tasks.generators.base import (
    CancelCheck,
    Canceled,
    ImageGenerator,
    ImageRequest,
    ImageResult,
    InvalidRequest,
    StepCallback,
    TextGenerator,
    TextRequest,
    TextResult,
    TransientGeneratorError,
    VideoGenerator,
    VideoRequest,
    VideoResult,
)

# Markers a test puts in a prompt to drive the failure paths.
FAIL = "[[fail]]"  # this request alone fails with InvalidRequest
TRANSIENT = "[[transient]]"  # the whole call raises TransientGeneratorError (retryable)


def _check_markers(requests: Sequence[TextRequest] | Sequence[VideoRequest] | Sequence[ImageRequest]) -> None:
    if any(TRANSIENT in req.prompt for req in requests):
        raise TransientGeneratorError("echo: transient failure requested by prompt marker")


def _refuse_marked(prompt: str) -> None:
    if FAIL in prompt:
        raise InvalidRequest("echo: failure requested by prompt")


class EchoTextGenerator(TextGenerator):
    """Returns "Shot: <prompt>" cut to max_new_tokens words, instantly."""

    name = "echo"
    version = "echo-text@1"

    def check_inputs(self, request: TextRequest) -> None:
        super().check_inputs(request)
        _refuse_marked(request.prompt)

    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        _check_markers(requests)
        if should_cancel is not None and should_cancel():
            raise Canceled("text generation canceled")
        results = []
        for idx, req in enumerate(requests):
            started = time.perf_counter()
            words = ("Shot: " + req.prompt.strip()).split()[: req.max_new_tokens]
            if on_step is not None:
                on_step(idx, len(words), len(words))
            results.append(TextResult(" ".join(words), len(words), time.perf_counter() - started))
        return results


def colour_for(prompt: str, seed: int | None) -> tuple[int, int, int]:
    """A stable RGB colour per (prompt, seed), so tests can tell outputs apart and compare reruns."""
    digest = hashlib.sha256(f"{prompt}\0{seed}".encode()).digest()
    return digest[0], digest[1], digest[2]


def _steps(
    idx: int, steps: int, on_step: StepCallback | None, should_cancel: CancelCheck | None, step_s: float
) -> None:
    """The echo render loop: per step a cancel check, the optional sleep, the progress report."""
    for step in range(1, steps + 1):
        if should_cancel is not None and should_cancel():
            raise Canceled("generation canceled")
        if step_s > 0:
            time.sleep(step_s)
        if on_step is not None:
            on_step(idx, step, steps)


class EchoVideoGenerator(VideoGenerator):
    """Solid-colour frames of the requested size, with Wan's size rules (the base class's defaults),
    so tests see real rejections.

    GENQUEUE_ECHO_STEP_SECONDS (default 0) sleeps that long per step, so kill/cancel tests can
    catch a task mid-run.
    """

    name = "echo"
    version = "echo-video@1"

    def check_inputs(self, request: VideoRequest) -> None:
        _refuse_marked(request.prompt)
        super().check_inputs(request)

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        _check_markers(requests)
        step_s = from_environment().echo_step_seconds  # per batch: tests set it in a running worker
        results = []
        for idx, req in enumerate(requests):
            started = time.perf_counter()
            _steps(idx, req.steps, on_step, should_cancel, step_s)
            frames = np.empty((req.num_frames, req.height, req.width, 3), dtype=np.uint8)
            frames[...] = colour_for(req.prompt, req.seed)
            extra = {"seed": req.seed, "batch": 1}
            results.append(VideoResult(frames, req.fps, time.perf_counter() - started, extra=extra))
        return results


class EchoImageGenerator(ImageGenerator):
    """Solid-colour images of the requested size (image k from seed + k), with Sana's size rule
    (the base class's default); GENQUEUE_ECHO_STEP_SECONDS as for the video echo."""

    name = "echo"
    version = "echo-image@1"

    def check_inputs(self, request: ImageRequest) -> None:
        _refuse_marked(request.prompt)
        super().check_inputs(request)

    def run_batch(
        self,
        requests: Sequence[ImageRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[ImageResult]:
        _check_markers(requests)
        step_s = from_environment().echo_step_seconds
        results = []
        for idx, req in enumerate(requests):
            started = time.perf_counter()
            _steps(idx, req.steps, on_step, should_cancel, step_s)
            images = np.empty((req.num_images, req.height, req.width, 3), dtype=np.uint8)
            for k in range(req.num_images):
                images[k] = colour_for(req.prompt, None if req.seed is None else req.seed + k)
            extra = {"seed": req.seed, "batch": 1}
            results.append(ImageResult(images, time.perf_counter() - started, extra=extra))
        return results
