"""Fixed-cost fake generators for benchmarks: echo's outputs after a set sleep, each call on record.

Each generate() call (one batch) sleeps GENQUEUE_BENCH_GENERATE_MS (default 200) milliseconds, then
returns what the echo adapter of its stage returns, so the stage around it (encode, upload, database
writes) does its real work. With GENQUEUE_BENCH_INTERVALS naming a file, every call appends one
JSON line {"kind": "generate", "stage", "pid", "start", "end", "n"} (wall-clock seconds, so the
lines of several worker processes line up), and load() hooks the worker's task start/end and video
encode so a benchmark can see where the time between two calls goes ("task", "encode" lines).

Workers name them like any adapter (tasks.generators.registry), by spec:
`GENQUEUE_VIDEO_MODEL=bench.fixed_generators:FixedVideoGenerator`; with `GENQUEUE_EXTRA_MODELS` set
to extra_models() below, that model goes by the id `fixed` (which jobs may name). register() puts the
name `fixed` in this process's registry itself, so `video_model="fixed"` works where it has run.
"""

from __future__ import annotations

import json
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from tasks.generators.base import (
    CancelCheck,
    ImageRequest,
    ImageResult,
    StepCallback,
    TextRequest,
    TextResult,
    VideoRequest,
    VideoResult,
)
from tasks.generators.echo import EchoImageGenerator, EchoTextGenerator, EchoVideoGenerator

MS_ENV = "GENQUEUE_BENCH_GENERATE_MS"
INTERVALS_ENV = "GENQUEUE_BENCH_INTERVALS"
DEFAULT_MS = 200.0
NAME = "fixed"
TARGETS = {
    "text": f"{__name__}:FixedTextGenerator",
    "video": f"{__name__}:FixedVideoGenerator",
    "image": f"{__name__}:FixedImageGenerator",
}

_lock = threading.Lock()
_files: dict[int, Any] = {}  # pid -> open append handle: a forked pool child opens its own


def generate_seconds() -> float:
    """The sleep per generate() call, read per call so a test can change it in a running process."""
    return float(os.environ.get(MS_ENV) or DEFAULT_MS) / 1000


def record(kind: str, **fields: Any) -> None:
    """Append one JSON line to the GENQUEUE_BENCH_INTERVALS file, if one is named; flushed at once.

    One write of a short line to an O_APPEND file: lines of several processes never interleave.
    """
    path = os.environ.get(INTERVALS_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "pid": os.getpid(), **fields}) + "\n"
    with _lock:
        out = _files.get(os.getpid())
        if out is None:
            out = _files[os.getpid()] = open(path, "a", buffering=1)  # noqa: SIM115  kept for the process
        out.write(line)
        out.flush()


@contextmanager
def _timed(stage: str, n: int) -> Iterator[None]:
    start = time.time()
    try:
        time.sleep(generate_seconds())
        yield
    finally:
        record("generate", stage=stage, start=start, end=time.time(), n=n)


def register() -> None:
    """Register the three under the name `fixed` in this process's registry."""
    from tasks.generators import registry

    for kind, target in TARGETS.items():
        registry.register(kind, NAME, target)


def extra_models() -> str:
    """GENQUEUE_EXTRA_MODELS naming the three `fixed`, for worker processes (and the API's catalog)."""
    return ",".join(f"{kind}:{NAME}={target}" for kind, target in TARGETS.items())


_hooked = False


def _hook_worker() -> None:
    """In a worker with an intervals file: record each task's start/end and each video encode."""
    global _hooked
    if _hooked or not os.environ.get(INTERVALS_ENV):
        return
    _hooked = True
    from celery.signals import task_postrun, task_prerun

    from tasks import artifacts

    started: dict[str, float] = {}

    def prerun(task_id: str = "", task: Any = None, **_: Any) -> None:
        started[task_id] = time.time()

    def postrun(task_id: str = "", task: Any = None, **_: Any) -> None:
        name = getattr(task, "name", "")
        record("task", name=name, start=started.pop(task_id, float("nan")), end=time.time())

    task_prerun.connect(prerun, weak=False, dispatch_uid="bench-fixed-prerun")
    task_postrun.connect(postrun, weak=False, dispatch_uid="bench-fixed-postrun")
    write_video: Callable[..., tuple[str, int]] = artifacts.write_video

    def timed_write_video(*args: Any, **kwargs: Any) -> tuple[str, int]:
        start = time.time()
        try:
            return write_video(*args, **kwargs)
        finally:
            record("encode", start=start, end=time.time())

    artifacts.write_video = timed_write_video  # the pipeline looks it up on the module per call


class FixedTextGenerator(EchoTextGenerator):
    """Echo's text after GENQUEUE_BENCH_GENERATE_MS per call."""

    name = NAME
    version = "fixed-text@1"

    def load(self) -> None:
        _hook_worker()

    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        with _timed("text", len(requests)):
            return super().run_batch(requests, should_cancel, on_step)


class FixedVideoGenerator(EchoVideoGenerator):
    """Echo's solid-colour frames after GENQUEUE_BENCH_GENERATE_MS per call."""

    name = NAME
    version = "fixed-video@1"

    def load(self) -> None:
        _hook_worker()

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        with _timed("video", len(requests)):
            return super().run_batch(requests, on_step, should_cancel)


class FixedImageGenerator(EchoImageGenerator):
    """Echo's solid-colour images after GENQUEUE_BENCH_GENERATE_MS per call."""

    name = NAME
    version = "fixed-image@1"

    def load(self) -> None:
        _hook_worker()

    def run_batch(
        self,
        requests: Sequence[ImageRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[ImageResult]:
        with _timed("image", len(requests)):
            return super().run_batch(requests, on_step, should_cancel)
