"""In-process dynamic batching: concurrent stage executions in one worker share one generate() call.

A worker runs `-P threads -c N`: each of the N task executions keeps its own message, ack, retry
and chain, and hands its request to the process-wide MicroBatcher of its model. One collector
thread groups what is waiting (up to max_size requests of the same shape) and calls the adapter
once; each caller gets its own result or error back. It waits at most max_wait after the first
arrival, and leaves early once no started task is still on its way and arrivals have paused for
max_wait/4 (so a lone job is not held the full max_wait).

Time limits: the threads pool enforces none, so every request carries a deadline (task start +
soft time limit). A caller stops waiting at its deadline and raises SoftTimeLimitExceeded (the
pipeline records `timeout`); a request whose caller has gone is dropped before its batch starts,
and a running batch stops once all its callers have gone; a call that outlives the stage's hard
limit ends the worker process (tasks/hang_guard.py). Under prefork the pool's own soft and hard
limits apply instead.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from celery import Task
from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import task_postrun, task_prerun

from models import Stage
from models.settings import Settings
from tasks import hang_guard
from tasks.contract.stages import StageSpec, spec_for, stage_of_task
from tasks.generators.base import (
    CancelCheck,
    Canceled,
    ImageGenerator,
    ImageRequest,
    StepCallback,
    TextGenerator,
    TextRequest,
    VideoGenerator,
    VideoRequest,
)
from tasks.generators.registry import get_generator
from tasks.metrics import generating

log = logging.getLogger(__name__)

# A stage's progress callback for its own request: on_progress(step, total_steps).
ProgressCallback = Callable[[int, int], None]

CANCEL_POLL_S = 1.0  # how often a waiting caller checks its job for a cancel (GIL wake-ups cost the batch)


@dataclass
class Meter:
    """The GPU seconds of one stage attempt: its share of every generate() call it rode in.

    A call of n requests that took t seconds charges t/n to each, whether it returned or raised,
    so a batch's time is counted once across its callers. Waiting for a batch costs nothing; a
    caller that stops waiting while its call runs (cancel, deadline) is charged its share so far.
    """

    seconds: float = 0.0


@dataclass(eq=False)
class Item:
    """One caller's request while it waits in (or runs with) a batch."""

    request: Any
    deadline: float  # time.monotonic() after which the caller no longer waits
    on_progress: ProgressCallback | None = None  # this request's steps only
    enqueued: float = field(default_factory=time.monotonic)
    done: threading.Event = field(default_factory=threading.Event)
    result: Any = None
    error: BaseException | None = None
    abandoned: bool = False  # the caller stopped waiting (deadline or cancel)
    gpu_s: float = 0.0  # this request's share of the calls it ran in (Meter)
    running_since: float | None = None  # its current call's start, and how many share it
    sharing: int = 1
    metered: bool = False  # its caller has read gpu_s: later shares are not its attempt's
    lock: threading.Lock = field(default_factory=threading.Lock)

    def charge(self, share: float) -> None:
        with self.lock:
            if not self.metered:
                self.gpu_s += share
            self.running_since = None

    def read_meter(self) -> float:
        """Its GPU seconds, once: a call still running counts up to now."""
        with self.lock:
            self.metered = True
            seconds = self.gpu_s
            if self.running_since is not None:
                seconds += (time.monotonic() - self.running_since) / self.sharing
            return seconds

    def gone(self) -> bool:
        return self.abandoned or time.monotonic() >= self.deadline


# Runs one batch: results in item order; may raise for the whole call.
RunBatch = Callable[[list[Item]], Sequence[Any]]


class MicroBatcher:
    """Collects requests from concurrent threads and runs them max_size at a time."""

    def __init__(
        self,
        name: str,
        run: RunBatch,
        max_size: int,
        max_wait_s: float,
        key: Callable[[Any], Hashable] = lambda _req: None,
    ) -> None:
        self.name, self._run_batch, self._key = name, run, key
        self.max_size, self.max_wait_s = max(1, max_size), max(0.0, max_wait_s)
        self._cond = threading.Condition()
        self._pending: list[Item] = []
        self._coming = 0  # tasks that started and will submit soon: worth waiting for
        self._thread: threading.Thread | None = None
        self.sizes: Counter[int] = Counter()  # batch size -> number of calls (tests, benchmarks)

    # -- callers ---------------------------------------------------------------------------------
    def expect(self) -> None:
        """A task that will submit a request has started (the collector may wait for it)."""
        with self._cond:
            self._coming += 1

    def unexpect(self) -> None:
        with self._cond:
            self._coming = max(0, self._coming - 1)
            self._cond.notify()

    def submit(
        self,
        request: Any,
        *,
        deadline: float,
        should_cancel: CancelCheck | None = None,
        on_progress: ProgressCallback | None = None,
        expected: bool = False,
        meter: Meter | None = None,
    ) -> Any:
        """Block until this request's result is ready; raises its own error, Canceled or a timeout.

        `meter` gets this request's GPU share, however it ends (Meter)."""
        item = Item(request, deadline, on_progress)
        try:
            return self._wait(item, should_cancel, expected)
        finally:
            if meter is not None:
                meter.seconds += item.read_meter()

    def _wait(self, item: Item, should_cancel: CancelCheck | None, expected: bool) -> Any:
        with self._cond:
            if expected:
                self._coming = max(0, self._coming - 1)
            self._pending.append(item)
            self._ensure_thread()
            self._cond.notify()
        while not item.done.is_set():
            remaining = item.deadline - time.monotonic()
            if remaining <= 0:
                item.abandoned = True
                raise SoftTimeLimitExceeded(f"{self.name}: deadline passed while waiting for the batch")
            if item.done.wait(min(remaining, CANCEL_POLL_S)):
                break
            if should_cancel is not None and should_cancel():
                item.abandoned = True
                raise Canceled(f"{self.name}: job canceled while waiting for the batch")
        if item.error is not None:
            raise item.error
        return item.result

    # -- collector -------------------------------------------------------------------------------
    def _ensure_thread(self) -> None:
        if self._thread is None or not self._thread.is_alive():
            self._thread = threading.Thread(target=self._loop, name=f"batcher-{self.name}", daemon=True)
            self._thread.start()

    def _next_batch(self) -> list[Item]:
        """Wait until a batch is worth running: full, nobody else coming, or max_wait passed."""
        with self._cond:
            while True:
                for item in [i for i in self._pending if i.gone()]:
                    self._pending.remove(item)
                    item.done.set()  # its caller has already left with a timeout or cancel
                if not self._pending:
                    self._cond.wait()
                    continue
                first = self._pending[0]
                key = self._key(first.request)
                same = [i for i in self._pending if self._key(i.request) == key]
                now = time.monotonic()
                waited, quiet = now - first.enqueued, now - self._pending[-1].enqueued
                # Full, or waited long enough, or nobody is on the way and arrivals have stopped.
                settled = self._coming == 0 and quiet >= self.max_wait_s / 4
                if len(same) >= self.max_size or waited >= self.max_wait_s or settled:
                    batch = same[: self.max_size]
                    for item in batch:
                        self._pending.remove(item)
                    return batch
                wake = self.max_wait_s - waited
                if self._coming == 0:
                    wake = min(wake, self.max_wait_s / 4 - quiet)
                self._cond.wait(max(wake, 0.001))

    def _loop(self) -> None:
        while True:
            batch = self._next_batch()
            try:
                self._run(batch)
            except BaseException as exc:  # the collector must outlive any one batch
                log.exception("batcher %s: batch of %d failed", self.name, len(batch))
                for item in batch:
                    item.error = item.error or exc
            finally:
                for item in batch:
                    item.done.set()

    def _run(self, batch: list[Item]) -> None:
        self.sizes[len(batch)] += 1
        started = time.monotonic()
        for item in batch:
            with item.lock:
                item.running_since, item.sharing = started, len(batch)
        try:
            results = self._run_batch(batch)
        except Exception as exc:
            _charge(batch, started)
            if len(batch) == 1 or isinstance(exc, Canceled) or all(i.gone() for i in batch):
                for item in batch:
                    item.error = exc
                return
            # One request can sink a whole call (a bad input that raises, out of memory): run
            # each alone so only the culprit fails and its batch-mates still get their results.
            log.warning("batcher %s: batch of %d raised %r; running each alone", self.name, len(batch), exc)
            for item in batch:
                if not item.gone():
                    self._run([item])
                item.done.set()
            return
        _charge(batch, started)
        for item, res in zip(batch, results, strict=True):
            item.result = res


def _charge(batch: list[Item], started: float) -> None:
    share = (time.monotonic() - started) / len(batch)
    for item in batch:
        item.charge(share)


# -- per-process batchers for the pipeline stages ------------------------------------------------

_batchers: dict[tuple[str, str, int], MicroBatcher] = {}
_lock = threading.Lock()
_local = threading.local()  # the batcher this thread's running task announced itself to


def _all_gone(batch: list[Item]) -> CancelCheck:
    return lambda: all(i.gone() for i in batch)


def _step_callback(progress: Sequence[ProgressCallback | None]) -> StepCallback | None:
    """The one reshaping between the callers' progress callbacks and the adapter's on_step.

    The adapter reports (index into the call's requests, step, total); each caller hears only
    its own request's (step, total).
    """
    if all(p is None for p in progress):
        return None

    def on_step(index: int, step: int, total: int) -> None:
        callback = progress[index]
        if callback is not None:
            callback(step, total)

    return on_step


def _generate(
    gen: TextGenerator | VideoGenerator | ImageGenerator,
    requests: Sequence[Any],
    progress: Sequence[ProgressCallback | None],
    should_cancel: CancelCheck | None,
) -> Sequence[Any]:
    """One generate() call; each caller hears its own request's steps (tokens, denoising steps)."""
    with generating(gen.stage, len(requests)):
        return gen.generate(requests, on_step=_step_callback(progress), should_cancel=should_cancel)


def _runner(spec: StageSpec, keep: int) -> RunBatch:
    def run(batch: list[Item]) -> Sequence[Any]:
        gen = get_generator(spec.stage, spec.model, spec.dtype, keep)  # reloaded if unloaded meanwhile
        requests, progress = [i.request for i in batch], [i.on_progress for i in batch]
        with hang_guard.guarded(f"{spec.stage}:{spec.model}", spec.time_limit_s):
            return _generate(gen, requests, progress, _all_gone(batch))

    return run


def _shape_key(fields: tuple[str, ...]) -> Callable[[Any], Hashable]:
    """Requests with equal `fields` may share a call (a video batch needs one size and step count)."""
    return lambda req: tuple(getattr(req, f) for f in fields)


def _spec(settings: Settings, stage: Stage | str, model: str | None) -> StageSpec:
    spec = spec_for(settings, stage)
    return replace(spec, model=model) if model else spec


def batcher_for(stage: Stage | str, settings: Settings, model: str | None = None) -> MicroBatcher:
    """The batcher of this process for `model`, by default the configured one (created on first use)."""
    spec = _spec(settings, stage, model)
    key = (spec.stage, spec.model, os.getpid())  # a forked child builds its own thread
    with _lock:
        b = _batchers.get(key)
        if b is None:
            b = MicroBatcher(
                f"{spec.stage}:{spec.model}",
                _runner(spec, settings.worker_max_models),
                spec.batch_max_size,
                spec.batch_max_wait_s,
                key=_shape_key(spec.batch_shape),
            )
            _batchers[key] = b
        return b


def _soft_limit(task: Task[Any, Any], spec: StageSpec) -> float:
    timelimit = getattr(task.request, "timelimit", None) or (None, None)
    return float(timelimit[1] or getattr(task, "soft_time_limit", None) or spec.soft_time_limit_s)


def run_batched(
    task: Task[Any, Any],
    settings: Settings,
    stage: Stage,
    request: TextRequest | VideoRequest | ImageRequest,
    should_cancel: CancelCheck | None = None,
    on_progress: ProgressCallback | None = None,
    model: str | None = None,
    meter: Meter | None = None,
) -> Any:
    """The stage's one result, computed in a batch with whatever else this worker is running.

    `model` overrides the configured model (a degraded retry's fallback gets its own batcher);
    `meter` gets the GPU seconds this request used (Meter), also when it raises.
    """
    spec = _spec(settings, stage, model)
    if threading.current_thread() is threading.main_thread():
        # A prefork child or the solo pool runs one task per process: nobody to batch with, and
        # the soft time limit (a signal to this thread) must interrupt generate() itself.
        gen = get_generator(spec.stage, spec.model, spec.dtype, settings.worker_max_models)
        started = time.monotonic()
        try:
            [result] = _generate(gen, [request], [on_progress], should_cancel)
        finally:
            if meter is not None:
                meter.seconds += time.monotonic() - started
        return result
    batcher = batcher_for(stage, settings, model)
    started = getattr(_local, "started", None) or time.monotonic()
    announced = getattr(_local, "batcher", None)
    expected = announced is batcher
    if announced is not None and not expected:
        announced.unexpect()  # announced to the default model's batcher; the job named another
    _local.batcher = None
    return batcher.submit(
        request,
        deadline=started + _soft_limit(task, spec),
        should_cancel=should_cancel,
        on_progress=on_progress,
        expected=expected,
        meter=meter,
    )


def _on_prerun(task: Any = None, **_: Any) -> None:
    # Announce the coming request as early as possible, so a batch waits for tasks still
    # reading their job instead of leaving without them.
    _local.started = time.monotonic()
    _local.batcher = None
    stage = stage_of_task(getattr(task, "name", None))
    if stage is None:
        return
    settings: Settings | None = getattr(task.app.conf, "genqueue_settings", None)
    if settings is None:
        return
    batcher = batcher_for(stage, settings)
    batcher.expect()
    _local.batcher = batcher


def _on_postrun(**_: Any) -> None:
    batcher = getattr(_local, "batcher", None)
    if batcher is not None:  # the task ended without submitting (nothing to do, or an error)
        batcher.unexpect()
    _local.batcher = None
    _local.started = None


task_prerun.connect(_on_prerun, weak=False, dispatch_uid="genqueue-batching-prerun")
task_postrun.connect(_on_postrun, weak=False, dispatch_uid="genqueue-batching-postrun")
