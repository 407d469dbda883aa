"""Adapter interface and typed requests/results shared by every model adapter."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

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


@dataclass(frozen=True)
class VideoResult:
    frames: np.ndarray  # uint8, shape (num_frames, height, width, 3)
    fps: int
    seconds: float
    error: GeneratorError | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# on_step(request_index, step, total_steps); should_cancel() -> True stops generation
StepCallback = Callable[[int, int, int], None]
CancelCheck = Callable[[], bool]


class TextGenerator(Protocol):
    name: str
    version: str
    device: str

    def load(self) -> None: ...

    def generate(
        self, requests: Sequence[TextRequest], should_cancel: CancelCheck | None = None
    ) -> list[TextResult]: ...


class VideoGenerator(Protocol):
    name: str
    version: str
    device: str

    def load(self) -> None: ...

    def generate(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]: ...
