"""The workers' Prometheus metrics: every definition, built on first use (docs/OPERATIONS.md lists them).

Nothing here runs at import, prometheus_client included: the library picks its storage (memory,
or multiprocess files under PROMETHEUS_MULTIPROC_DIR) when imported, which tasks.metrics_server
arranges. The instrumented modules call these with a line per event. Labels are bounded: stages,
statuses, error codes and outcomes from the code, never a job id or a tenant.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import event
from sqlalchemy.orm import Session

from models.base import utcnow
from models.job import Job, Stage

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Seconds: from a fast text job's milliseconds to a long video render or a deep queue.
DURATION_BUCKETS = (0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600, 1800, 3600)
LOAD_BUCKETS = (0.1, 0.5, 1, 5, 15, 30, 60, 120, 300, 600)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32, 64)


@dataclass(frozen=True)
class WorkerMetrics:
    registry: CollectorRegistry  # this process's own; with multiprocess files the server reads those
    queue_wait: Histogram
    stage_duration: Histogram
    job_duration: Histogram
    jobs_finished: Counter
    retries: Counter
    degradations: Counter
    compensations: Counter
    reaper_actions: Counter
    batch_size: Histogram
    generator_busy: Counter
    model_load: Histogram
    cache_followers: Counter
    webhook_attempts: Counter
    consuming: Gauge


_lock = threading.Lock()  # the first calls race in a threads pool: build (and register) once


def metrics() -> WorkerMetrics:
    """This process's metrics (created on the first call; a forked child's values start at zero)."""
    with _lock:
        return _build()


@functools.cache
def _build() -> WorkerMetrics:
    from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

    r = CollectorRegistry(auto_describe=True)
    return WorkerMetrics(
        registry=r,
        queue_wait=Histogram(
            "genqueue_queue_wait_seconds",
            "From publish (text) or the end of the text stage (video, image) to a worker starting the stage; "
            "first attempt only.",
            ["stage"],
            buckets=DURATION_BUCKETS,
            registry=r,
        ),
        stage_duration=Histogram(
            "genqueue_stage_duration_seconds",
            "Time a stage took to produce its output (batch wait and generate), for completed stages.",
            ["stage"],
            buckets=DURATION_BUCKETS,
            registry=r,
        ),
        job_duration=Histogram(
            "genqueue_job_duration_seconds",
            "From submit to the terminal state, for jobs a worker finished.",
            ["status"],
            buckets=DURATION_BUCKETS,
            registry=r,
        ),
        jobs_finished=Counter(
            "genqueue_jobs_finished",
            "Jobs a worker moved to a terminal state, by status and error code (none on success).",
            ["status", "error_code"],
            registry=r,
        ),
        retries=Counter(
            "genqueue_stage_retries",
            "Stage retries scheduled, by stage and reason (the generator's error code, degraded, infra).",
            ["stage", "reason"],
            registry=r,
        ),
        degradations=Counter(
            "genqueue_degradations",
            "Degraded video and image retries recorded, by what caused them (out_of_memory, timeout).",
            ["reason"],
            registry=r,
        ),
        compensations=Counter(
            "genqueue_compensations",
            "Failed or canceled jobs whose side effects were undone (once per job), by status.",
            ["status"],
            registry=r,
        ),
        reaper_actions=Counter(
            "genqueue_reaper_actions",
            "What the reaper did to stuck jobs and old keys, by action (requeued_<why>, failed...).",
            ["action"],
            registry=r,
        ),
        batch_size=Histogram(
            "genqueue_batch_size",
            "Requests per generate() call, by stage.",
            ["stage"],
            buckets=BATCH_BUCKETS,
            registry=r,
        ),
        generator_busy=Counter(
            "genqueue_generator_busy_seconds",
            "Seconds spent inside generate(), by stage.",
            ["stage"],
            registry=r,
        ),
        model_load=Histogram(
            "genqueue_model_load_seconds",
            "Time to load and warm up a model in a worker process, by stage.",
            ["stage"],
            buckets=LOAD_BUCKETS,
            registry=r,
        ),
        cache_followers=Counter(
            "genqueue_cache_followers_finished",
            "Coalesced identical jobs finished together with the job they followed, by status.",
            ["status"],
            registry=r,
        ),
        webhook_attempts=Counter(
            "genqueue_webhook_attempts",
            "Webhook requests sent, by outcome (delivered, retry, exhausted, gone, failed).",
            ["outcome"],
            registry=r,
        ),
        # Set by the main process when its consumer starts: the series lives exactly as long as
        # the worker's endpoint does, so "messages waiting and no series" means no consumer at all.
        consuming=Gauge(
            "genqueue_worker_consuming",
            "1 for each queue this worker consumes from (set when its consumer starts, 0 at shutdown).",
            ["queue"],
            registry=r,
            multiprocess_mode="livemax",
        ),
    )


def webhook_overdue_jobs() -> Gauge:
    """Created by the first relay run: a worker that runs none has no value to show (not a 0)."""
    registry = metrics().registry
    with _lock:
        return _build_overdue(registry)


@functools.cache
def _build_overdue(r: CollectorRegistry) -> Gauge:
    from prometheus_client import Gauge

    return Gauge(
        "genqueue_webhook_overdue_jobs",
        "Jobs with webhook messages overdue at the last relay run (at most 1000).",
        registry=r,
        multiprocess_mode="mostrecent",
    )


@dataclass(frozen=True)
class GpuGauges:
    allocated: Gauge
    reserved: Gauge
    total: Gauge
    utilization: Gauge


def gpu_gauges() -> GpuGauges:
    """The GPU gauges, created only by a process that uses CUDA: on CPU they stay absent."""
    registry = metrics().registry
    with _lock:
        return _build_gpu(registry)


@functools.cache
def _build_gpu(r: CollectorRegistry) -> GpuGauges:
    from prometheus_client import Gauge

    return GpuGauges(
        # Per-process allocator figures: live processes summed (several children, one device).
        allocated=Gauge(
            "genqueue_gpu_memory_allocated_bytes",
            "Device memory held by tensors (torch), by device; summed over live worker processes.",
            ["device"],
            registry=r,
            multiprocess_mode="livesum",
        ),
        reserved=Gauge(
            "genqueue_gpu_memory_reserved_bytes",
            "Device memory reserved by torch's caching allocator, by device; summed over live processes.",
            ["device"],
            registry=r,
            multiprocess_mode="livesum",
        ),
        # Device-wide: every process sees the same value.
        total=Gauge(
            "genqueue_gpu_memory_total_bytes",
            "Total memory of the device (torch.cuda.get_device_properties), by device.",
            ["device"],
            registry=r,
            multiprocess_mode="livemax",
        ),
        utilization=Gauge(
            "genqueue_gpu_utilization_percent",
            "Percent of the last sample period the device was busy (NVML; needs nvidia-ml-py).",
            ["device"],
            registry=r,
            multiprocess_mode="livemax",
        ),
    )


def _since(start: datetime | None, end: datetime | None = None) -> float | None:
    return None if start is None else max(0.0, ((end or utcnow()) - start).total_seconds())


def stage_entered(job: Job, stage: Stage) -> None:
    """Observe the queue wait of a job's first entry into `stage` (a retry or redelivery waits for
    other reasons: not a queue wait)."""
    if job.attempts != 1:
        return
    if stage == Stage.TEXT:
        waited = _since(job.published_at or job.created_at, job.started_at)
    else:
        waited = _since(job.text_completed_at)
    if waited is not None:
        metrics().queue_wait.labels(stage).observe(waited)


def on_job_finished(session: Session, job: Job, followers: int) -> None:
    """models.states observer: count a job's terminal transition once its transaction commits."""
    status, code = job.status, job.error_code or "none"
    total = None if job.cached else _since(job.created_at, job.completed_at)  # a copy took no time

    def record(_session: Session) -> None:
        m = metrics()
        m.jobs_finished.labels(status, code).inc()
        if total is not None:
            m.job_duration.labels(status).observe(total)
        if followers:
            m.cache_followers.labels(status).inc(followers)

    event.listen(session, "after_commit", record, once=True)


def consuming(queues: Iterable[str], value: float = 1.0) -> None:
    """Mark the queues this worker's consumer reads from (1), or no longer reads from (0)."""
    gauge = metrics().consuming
    for queue in queues:
        gauge.labels(queue).set(value)


@contextmanager
def generating(stage: str, requests: int) -> Iterator[None]:
    """Around one generate() call: its batch size and the seconds it kept the generator busy."""
    started = time.monotonic()
    try:
        yield
    finally:
        m = metrics()
        m.batch_size.labels(stage).observe(requests)
        m.generator_busy.labels(stage).inc(time.monotonic() - started)
