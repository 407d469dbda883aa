"""Adapters for failure tests, loaded by spec ("tests.support.generators:Class") like any model.

Each one misbehaves in one way a real model can: fails transiently a few times, hangs, runs
slowly token by token, runs out of memory above a size, costs time in proportion to its size, or
kills its own process. SlowText and TracedVideo record each request's run (steps done, how it
ended) so an in-process test can tell a stage that stopped from one that ran to the end.
"""

from __future__ import annotations

import dataclasses
import os
import re
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from tasks.generators.base import (
    CancelCheck,
    Canceled,
    ImageRequest,
    ImageResult,
    OutOfMemory,
    StepCallback,
    TextRequest,
    TextResult,
    TransientGeneratorError,
    VideoRequest,
    VideoResult,
)
from tasks.generators.echo import EchoImageGenerator, EchoTextGenerator, EchoVideoGenerator

_calls: Counter[str] = Counter()
_lock = threading.Lock()
FLAKY = re.compile(r"\[\[flaky:(\d+)\]\]")


@dataclass
class Run:
    """One request's pass through a traced adapter's generate() in this process."""

    prompt: str
    started: float = field(default_factory=time.monotonic)
    steps: int = 0  # tokens emitted or diffusion steps done so far
    ended: float | None = None
    outcome: str | None = None  # "finished", or the class name of what it raised ("Canceled")


_runs: list[Run] = []


def runs(marker: str) -> list[Run]:
    """The runs in this process whose prompt contains `marker`, oldest first."""
    with _lock:
        return [r for r in _runs if marker in r.prompt]


def _finish(batch: list[Run], outcome: str) -> None:
    now = time.monotonic()
    for run in batch:
        run.ended, run.outcome = now, outcome


@contextmanager
def _traced(prompts: Sequence[str]) -> Iterator[list[Run]]:
    batch = [Run(p) for p in prompts]
    with _lock:
        _runs.extend(batch)
    try:
        yield batch
    except BaseException as exc:
        _finish(batch, type(exc).__name__)
        raise
    _finish(batch, "finished")


class FlakyText(EchoTextGenerator):
    """A prompt with [[flaky:N]] fails transiently on its first N calls in this process."""

    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        for req in requests:
            m = FLAKY.search(req.prompt)
            if m:
                with _lock:
                    _calls[req.prompt] += 1
                    n = _calls[req.prompt]
                if n <= int(m.group(1)):
                    raise TransientGeneratorError(f"flaky: call {n} of {m.group(1)} fails")
        return super().run_batch(requests, should_cancel, on_step)


class CostlyFlakyText(FlakyText):
    """FlakyText whose every call costs GENQUEUE_TEST_CALL_SECONDS (default 0.1) per request,
    failed calls included, so each attempt's share of GPU time is at least that much."""

    def run_batch(
        self, requests: Sequence[TextRequest], should_cancel: CancelCheck | None = None
    ) -> list[TextResult]:
        time.sleep(float(os.environ.get("GENQUEUE_TEST_CALL_SECONDS") or 0.1) * len(requests))
        return super().run_batch(requests, should_cancel)


class HangingText(EchoTextGenerator):
    """A prompt with [[hang]] never returns: the call blocks for good and ignores cancels, as a
    model stuck in a kernel or a deadlock would."""

    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        if any("[[hang]]" in r.prompt for r in requests):
            threading.Event().wait()
        return super().run_batch(requests, should_cancel, on_step)


class SlowText(EchoTextGenerator):
    """Emits one word per GENQUEUE_TEST_TOKEN_SECONDS (default 0.2), checking for cancel at each."""

    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        delay = float(os.environ.get("GENQUEUE_TEST_TOKEN_SECONDS") or 0.2)
        out = []
        with _traced([r.prompt for r in requests]) as traced:
            for idx, (req, run) in enumerate(zip(requests, traced, strict=True)):
                words: list[str] = []
                budget = min(req.max_new_tokens, len(req.prompt.split()))
                for word in req.prompt.split()[: req.max_new_tokens]:
                    if should_cancel is not None and should_cancel():
                        raise Canceled("text generation canceled")
                    time.sleep(delay)
                    words.append(word)
                    run.steps = len(words)
                    if on_step is not None:
                        on_step(idx, len(words), budget)
                out.append(TextResult(" ".join(words), len(words), delay * len(words)))
        return out


class TracedVideo(EchoVideoGenerator):
    """The echo video adapter (GENQUEUE_ECHO_STEP_SECONDS per step), recording each run."""

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        with _traced([r.prompt for r in requests]) as traced:

            def step(index: int, done: int, total: int) -> None:
                traced[index].steps = done
                if on_step is not None:
                    on_step(index, done, total)

            return super().run_batch(requests, step, should_cancel)


class DeafVideo(TracedVideo):
    """TracedVideo that never checks for cancel: an adapter that cannot stop inside its call."""

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        return super().run_batch(requests, on_step, None)


class SizeLimitedVideo(EchoVideoGenerator):
    """Raises OutOfMemory (as a CUDA OOM maps to) above GENQUEUE_TEST_MAX_PIXELS (default 64*64)."""

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        limit = int(os.environ.get("GENQUEUE_TEST_MAX_PIXELS") or 64 * 64)
        for req in requests:
            if req.width * req.height > limit:
                raise OutOfMemory(f"test: {req.width}x{req.height} does not fit")
        return super().run_batch(requests, on_step, should_cancel)


class CostlyVideo(EchoVideoGenerator):
    """Sleeps GENQUEUE_TEST_PIXEL_STEP_SECONDS per (64x64 pixels x step): cost follows size."""

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        unit = float(os.environ.get("GENQUEUE_TEST_PIXEL_STEP_SECONDS") or 0.05)
        for req in requests:
            per_step = unit * req.width * req.height / (64 * 64)
            for step in range(1, req.steps + 1):
                time.sleep(per_step)
                if on_step is not None:
                    on_step(0, step, req.steps)
        return super().run_batch(requests, None, should_cancel)


class CrashingVideo(EchoVideoGenerator):
    """A prompt with [[crash]] kills the process running it, as a segfault or the OOM killer would."""

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        if any("[[crash]]" in req.prompt for req in requests):
            os._exit(137)
        return super().run_batch(requests, on_step, should_cancel)


class PausingVideo(EchoVideoGenerator):
    """With GENQUEUE_TEST_PAUSE_DIR set, its process stops dead twice per job, for a kill test.

    `written`: the MP4 is complete under its temp name, not yet renamed (nor the job committed).
    `committed`: the stage has committed the job's success; the temp sweep and the ack are next.
    Each pause happens once per job: it creates `<dir>/<job id>.<point>` holding its pid, then
    sleeps until killed. load() installs the pauses in each (pool child) process that loads it.
    """

    def load(self) -> None:
        folder = os.environ.get("GENQUEUE_TEST_PAUSE_DIR")
        if folder:
            _install_pauses(Path(folder))


def _pause(folder: Path, job_id: object, point: str) -> None:
    try:
        with open(folder / f"{job_id}.{point}", "x") as marker:
            marker.write(str(os.getpid()))
    except FileExistsError:
        return  # paused here before (and killed): carry on this time
    while True:
        time.sleep(60)


def _install_pauses(folder: Path) -> None:
    from tasks import artifacts, media

    encode, sweep = media._encode, artifacts.sweep_temp
    if getattr(encode, "paused", False):
        return

    def paused_encode(path: str, fmt: str, *args: Any, **kwargs: Any) -> None:
        encode(path, fmt, *args, **kwargs)
        if fmt == "mp4":  # the temp file is whole; os.replace comes next
            _pause(folder, Path(path).parent.name, "written")

    def paused_sweep(root: Path, job_id: Any) -> int:
        _pause(folder, job_id, "committed")  # the pipeline sweeps right after the commit
        return sweep(root, job_id)

    paused_encode.paused = True  # type: ignore[attr-defined]
    media._encode, artifacts.sweep_temp = paused_encode, paused_sweep  # type: ignore[assignment]


class TaggedText(EchoTextGenerator):
    """The echo text model under another id: its text starts "Tagged:", so a test sees which model ran."""

    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        results = super().run_batch(requests, should_cancel, on_step)
        return [dataclasses.replace(r, text=f"Tagged: {r.text}") for r in results]


class SwappedText(TaggedText):
    """TaggedText's next version, for hot-swap tests: its text starts "Swapped:"."""

    def run_batch(
        self,
        requests: Sequence[TextRequest],
        should_cancel: CancelCheck | None = None,
        on_step: StepCallback | None = None,
    ) -> list[TextResult]:
        results = super().run_batch(requests, should_cancel, on_step)
        return [dataclasses.replace(r, text=r.text.replace("Tagged:", "Swapped:", 1)) for r in results]


class TracedImage(EchoImageGenerator):
    """The echo image adapter (GENQUEUE_ECHO_STEP_SECONDS per step), recording each run and the
    size of every call (`calls`: how many requests shared one run_batch)."""

    calls: list[int] = []

    def run_batch(
        self,
        requests: Sequence[ImageRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[ImageResult]:
        with _lock:
            TracedImage.calls.append(len(requests))
        with _traced([r.prompt for r in requests]) as traced:

            def step(index: int, done: int, total: int) -> None:
                traced[index].steps = done
                if on_step is not None:
                    on_step(index, done, total)

            return super().run_batch(requests, step, should_cancel)


class SizeLimitedImage(EchoImageGenerator):
    """Raises OutOfMemory above GENQUEUE_TEST_MAX_PIXELS (default 64*64) pixels per image."""

    def run_batch(
        self,
        requests: Sequence[ImageRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[ImageResult]:
        limit = int(os.environ.get("GENQUEUE_TEST_MAX_PIXELS") or 64 * 64)
        for req in requests:
            if req.width * req.height > limit:
                raise OutOfMemory(f"test: {req.width}x{req.height} does not fit")
        return super().run_batch(requests, on_step, should_cancel)


class NoisyVideo(EchoVideoGenerator):
    """Random-noise frames: incompressible, so a 128x128 frame costs ~30 KB of MP4 and a short
    clip spans several parts of a (test-sized) multipart upload."""

    def run_batch(
        self,
        requests: Sequence[VideoRequest],
        on_step: StepCallback | None = None,
        should_cancel: CancelCheck | None = None,
    ) -> list[VideoResult]:
        results = super().run_batch(requests, on_step, should_cancel)
        for req, result in zip(requests, results, strict=True):
            rng = np.random.default_rng(req.seed)
            result.frames[...] = rng.integers(0, 256, result.frames.shape, dtype=np.uint8)
        return results


class UploadPausingVideo(NoisyVideo):
    """With GENQUEUE_TEST_PAUSE_DIR set, its process stops dead once per job right after the
    first part of the video's multipart upload (`<dir>/<job id>.uploading` holds its pid): the
    upload is half sent, no object exists yet. For the S3 kill test."""

    def load(self) -> None:
        folder = os.environ.get("GENQUEUE_TEST_PAUSE_DIR")
        if not folder or getattr(UploadPausingVideo, "_installed", False):
            return
        from models.storage import s3

        def after_part(key: str, number: int) -> None:
            if number == 1 and key.endswith("/video.mp4"):
                _pause(Path(folder), key.split("/")[-2], "uploading")

        s3.on_part(after_part)
        UploadPausingVideo._installed = True  # type: ignore[attr-defined]


class PausingStitch(EchoVideoGenerator):
    """The echo video model, whose process (with GENQUEUE_TEST_PAUSE_DIR set) stops dead once per
    right after a stitch wrote its film, before the film is stored (`<dir>/storyboard.stitched`
    holds the pid), for a kill test; GENQUEUE_ECHO_STEP_SECONDS as for the echo."""

    def load(self) -> None:
        folder = os.environ.get("GENQUEUE_TEST_PAUSE_DIR")
        if folder:
            _install_stitch_pause(Path(folder))


def _install_stitch_pause(folder: Path) -> None:
    from tasks import storyboard

    stitch = storyboard.stitch_mp4
    if getattr(stitch, "paused", False):
        return

    def paused_stitch(inputs: Sequence[str], path: str, fps: int) -> dict[str, int]:
        info = stitch(inputs, path, fps)
        _pause(folder, "storyboard", "stitched")  # once per test folder: one storyboard per test
        return info

    paused_stitch.paused = True  # type: ignore[attr-defined]
    storyboard.stitch_mp4 = paused_stitch  # type: ignore[assignment]
