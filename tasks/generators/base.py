"""The adapter contract: typed requests/results, errors, and the validate-run-collect loop every model shares.

An adapter is one class: `load()` once per process, then `generate()` many times. `generate()` is
written here, not in each adapter: it runs `check_inputs()` on every request, turns a refusal into
that request's own failed result, hands the valid rest to the adapter's `run_batch()` and puts the
results back in request order. Adapters (and the test doubles) implement `check_inputs` (extending
the rules below) and `run_batch`; nothing here imports torch.
"""

from __future__ import annotations

import functools
import inspect
import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

import numpy as np


class GeneratorError(Exception):
    """Base class for adapter failures; `retryable` tells the task whether to retry."""

    retryable = False
    code = "generation_failed"


class InvalidRequest(GeneratorError):
    """The request cannot be served by this model (bad size, empty prompt...)."""

    code = "invalid_request"


class TransientGeneratorError(GeneratorError):
    """A failure that may succeed on retry (out of memory, device busy)."""

    retryable = True
    code = "transient_failure"


class OutOfMemory(TransientGeneratorError):
    """The device ran out of memory for this request."""

    code = "out_of_memory"


class Canceled(GeneratorError):
    """Generation stopped because the job was canceled."""

    code = "canceled"


@dataclass(frozen=True)
class TextRequest:
    prompt: str
    max_new_tokens: int = 64
    temperature: float = 0.0  # 0 means greedy decoding
    seed: int | None = None
    # Against the loops a small model falls into, greedy above all (Settings carries the same
    # defaults as text_repetition_penalty / text_no_repeat_ngram_size); 1.0 and 0 turn them off.
    repetition_penalty: float = 1.2
    no_repeat_ngram_size: int = 4
    # The instruction the prompt is rendered under; None: the adapter's own (a video shot's).
    system_prompt: str | None = None


@dataclass(frozen=True)
class TextResult:
    text: str
    tokens: int
    seconds: float
    error: GeneratorError | None = None  # per-request failure inside a batch


@dataclass(frozen=True)
class VideoRequest:
    prompt: str
    width: int = 256
    height: int = 256
    num_frames: int = 17
    fps: int = 8
    steps: int = 8
    seed: int | None = None
    guidance_scale: float = 1.0


EMPTY_FRAMES = np.zeros((0, 0, 0, 3), dtype=np.uint8)


@dataclass(frozen=True)
class ImageRequest:
    prompt: str
    width: int = 512
    height: int = 512
    steps: int = 8
    seed: int | None = None  # image k of the request is drawn from seed + k
    guidance_scale: float = 4.5
    num_images: int = 1


@dataclass(frozen=True)
class VideoResult:
    frames: np.ndarray  # uint8, shape (num_frames, height, width, 3)
    fps: int
    seconds: float
    error: GeneratorError | None = None
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class ImageResult:
    images: np.ndarray  # uint8, shape (num_images, height, width, 3)
    seconds: float
    error: GeneratorError | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# on_step(request_index, step, total_steps); should_cancel() -> True stops generation
StepCallback = Callable[[int, int, int], None]
CancelCheck = Callable[[], bool]

Req = TypeVar("Req", TextRequest, VideoRequest, ImageRequest)
Res = TypeVar("Res", TextResult, VideoResult, ImageResult)


def check_prompt(prompt: object) -> None:
    if not isinstance(prompt, str) or not prompt.strip():
        raise InvalidRequest("prompt is empty")


def check_render(request: VideoRequest | ImageRequest, multiple: int, max_side: int, max_steps: int) -> None:
    """The rules a video and an image request share: prompt, sides on the model's grid, steps, guidance."""
    check_prompt(request.prompt)
    for side, value in (("width", request.width), ("height", request.height)):
        if value <= 0 or value % multiple or value > max_side:
            raise InvalidRequest(
                f"{side} must be a positive multiple of {multiple} up to {max_side}, got {value}"
            )
    if not 1 <= request.steps <= max_steps:
        raise InvalidRequest(f"steps must be between 1 and {max_steps}, got {request.steps}")
    if not (request.guidance_scale >= 0 and math.isfinite(request.guidance_scale)):
        raise InvalidRequest("guidance_scale must be a finite number >= 0")


def collect(
    requests: Sequence[Req],
    check: Callable[[Req], None],
    failed: Callable[[Req, InvalidRequest], Res],
    run: Callable[[list[int]], Sequence[Res]],
) -> list[Res]:
    """Check each request, run the valid ones (by index) in one call, and return results in order.

    An InvalidRequest concerns one request and becomes its result; anything `run` raises concerns
    the whole call (out of memory, cancel, a transient failure) and propagates.
    """
    results: list[Res | None] = [None] * len(requests)
    valid: list[int] = []
    for idx, req in enumerate(requests):
        try:
            check(req)
        except InvalidRequest as exc:
            results[idx] = failed(req, exc)
            continue
        valid.append(idx)
    if valid:
        done = run(valid)
        for idx, res in zip(valid, done, strict=True):  # an adapter that drops a result is a bug
            results[idx] = res
    return [r for r in results if r is not None]


class Generator(ABC):
    """What every adapter has: a name and version (they key the result cache), a device, a lifecycle."""

    stage: ClassVar[str]
    name: str = ""
    version: str = ""
    device: str = "cpu"

    def load(self) -> None:  # noqa: B027  optional: an adapter without weights has nothing to load
        """Load weights and warm up; called once per process before the first generate()."""

    def ready(self) -> bool:
        """False until load() has run, for adapters that cannot generate before it."""
        return True

    def _require_ready(self) -> None:
        if not self.ready():
            raise RuntimeError("load() must be called before generate()")


class TextGenerator(Generator):
    """A text model: expands a user's idea into a shot description."""

    stage: ClassVar[str] = "text"
    max_new_tokens_limit = 1024

    def check_inputs(self, request: TextRequest) -> None:
        """Raise InvalidRequest, with a message the API can show as-is, for a request this model refuses."""
        check_prompt(request.prompt)
        if not 1 <= request.max_new_tokens <= self.max_new_tokens_limit:
            raise InvalidRequest(f"max_new_tokens must be between 1 and {self.max_new_tokens_limit}")
        if not (request.temperature >= 0 and math.isfinite(request.temperature)):
            raise InvalidRequest("temperature must be a finite number >= 0")
        if not (request.repetition_penalty >= 1 and math.isfinite(request.repetition_penalty)):
            raise InvalidRequest("repetition_penalty must be a finite number >= 1")
        if request.no_repeat_ngram_size < 0:
            raise InvalidRequest("no_repeat_ngram_size must be >= 0")

    @abstractmethod
    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        """One result per (already checked) request, in order; raises for whole-call failures.

        on_step(index, tokens, budget) after generated tokens (index into `requests`), if the
        adapter can tell; a batched call may report every row at each token.
        """

    def generate(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        """One result per request, in order; a refused request fails alone (its result's `error`).

        on_step(index, tokens, budget) reports progress with `index` into `requests`.
        """
        self._require_ready()

        def run(valid: list[int]) -> list[TextResult]:
            batch = [requests[i] for i in valid]
            if on_step is None or not _reports_steps(type(self)):
                return self.run_batch(batch, should_cancel)
            return self.run_batch(batch, should_cancel, on_step=lambda i, s, t: on_step(valid[i], s, t))

        return collect(requests, self.check_inputs, _failed_text, run)


@functools.cache
def _reports_steps(cls: type[TextGenerator]) -> bool:
    """Does this adapter's run_batch take on_step? Text adapters written before it existed do not,
    and still work (their stage's progress then moves only when it completes)."""
    return "on_step" in inspect.signature(cls.run_batch).parameters


class VideoGenerator(Generator):
    """A text-to-video model. Sizes follow the model's latent grid: sides are multiples of
    `spatial_multiple` and num_frames is `temporal_multiple`*k+1 (an adapter may learn them in load())."""

    stage: ClassVar[str] = "video"
    spatial_multiple = 16
    temporal_multiple = 4
    max_side = 2048
    max_frames = 257
    max_steps = 200

    def check_inputs(self, request: VideoRequest) -> None:
        """Raise InvalidRequest, with a message the API can show as-is, for a request this model refuses."""
        check_render(request, self.spatial_multiple, self.max_side, self.max_steps)
        frame_step = self.temporal_multiple
        frames = request.num_frames
        if frames < 1 or (frames - 1) % frame_step or frames > self.max_frames:
            raise InvalidRequest(
                f"num_frames must be {frame_step}*k+1 (e.g. {frame_step * 4 + 1}) up to {self.max_frames},"
                f" got {frames}"
            )
        if request.fps < 1:
            raise InvalidRequest(f"fps must be >= 1, got {request.fps}")

    @abstractmethod
    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        """One result per (already checked) request, in order; on_step's index is into `requests`."""

    def generate(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        """One result per request, in order; a refused request fails alone (its result's `error`).

        on_step(index, step, total) reports progress with `index` into `requests`, step in 1..total.
        """
        self._require_ready()

        def run(valid: list[int]) -> list[VideoResult]:
            # run_batch numbers the valid requests from 0; the caller knows them by their place here.
            step = None if on_step is None else (lambda i, s, t: on_step(valid[i], s, t))
            return self.run_batch([requests[i] for i in valid], step, should_cancel)

        return collect(requests, self.check_inputs, _failed_video, run)


class ImageGenerator(Generator):
    """A text-to-image model. Sides are multiples of `spatial_multiple` (an adapter may learn it in
    load()); a request asks for `num_images` images, which the adapter renders in one call."""

    stage: ClassVar[str] = "image"
    spatial_multiple = 32
    max_side = 4096
    max_steps = 200
    max_images = 4

    def check_inputs(self, request: ImageRequest) -> None:
        """Raise InvalidRequest, with a message the API can show as-is, for a request this model refuses."""
        check_render(request, self.spatial_multiple, self.max_side, self.max_steps)
        if not 1 <= request.num_images <= self.max_images:
            raise InvalidRequest(
                f"num_images must be between 1 and {self.max_images}, got {request.num_images}"
            )

    @abstractmethod
    def run_batch(
        self,
        requests: Sequence[ImageRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[ImageResult]:
        """One result per (already checked) request, in order; on_step's index is into `requests`."""

    def generate(
        self,
        requests: Sequence[ImageRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[ImageResult]:
        """One result per request, in order; a refused request fails alone (its result's `error`).

        on_step(index, step, total) reports progress with `index` into `requests`, step in 1..total.
        """
        self._require_ready()

        def run(valid: list[int]) -> list[ImageResult]:
            step = None if on_step is None else (lambda i, s, t: on_step(valid[i], s, t))
            return self.run_batch([requests[i] for i in valid], step, should_cancel)

        return collect(requests, self.check_inputs, _failed_image, run)


def _failed_image(request: ImageRequest, error: InvalidRequest) -> ImageResult:
    return ImageResult(images=EMPTY_FRAMES, seconds=0.0, error=error)


def _failed_text(request: TextRequest, error: InvalidRequest) -> TextResult:
    return TextResult(text="", tokens=0, seconds=0.0, error=error)


def _failed_video(request: VideoRequest, error: InvalidRequest) -> VideoResult:
    return VideoResult(frames=EMPTY_FRAMES, fps=request.fps, seconds=0.0, error=error)
