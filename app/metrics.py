"""Prometheus metrics: request counts and latency per route and status, jobs submitted per modality.

With PROMETHEUS_MULTIPROC_DIR set (gunicorn with several workers) prometheus-client keeps the
values in files there and /metrics aggregates every process; the directory must exist, be
emptied before the server starts, and the variable be set before this process imports
prometheus_client (the library reads it at import).
"""

from __future__ import annotations

import os
import re
import time

from flask import Flask, Response, g, request
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
    multiprocess,
)

from app.errors import REASONS, ApiError


class Metrics:
    """One registry per app, so several apps in one process (tests) never collide."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.requests = Counter(
            "genqueue_http_requests",
            "HTTP requests by route template, method and status.",
            ["endpoint", "method", "status"],
            registry=self.registry,
        )
        self.latency = Histogram(
            "genqueue_http_request_duration_seconds",
            "HTTP request latency by route template and method.",
            ["endpoint", "method"],
            registry=self.registry,
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
        )
        self.problems = Counter(
            "genqueue_http_problems",
            "Problem (error) responses by status, problem type and reason (429: which limit; "
            "503: which admission bound or dependency).",
            ["status", "type", "reason"],
            registry=self.registry,
        )
        # Summed over the live processes only: a killed worker's requests are not in progress
        # any more (ops/gunicorn.conf.py's child_exit drops its file).
        self.in_progress = Gauge(
            "genqueue_http_requests_in_progress",
            "HTTP requests the app is handling now (a `Prefer: wait` submit counts while held).",
            registry=self.registry,
            multiprocess_mode="livesum",
        )
        self.jobs_submitted = Counter(
            "genqueue_jobs_submitted",
            "Jobs accepted and published, by modality.",
            ["modality"],
            registry=self.registry,
        )
        self.cache_hits = Counter(
            "genqueue_cache_hits",
            "Submits answered by the result cache, by modality and kind: `result` (a finished "
            "identical job's outputs, no work queued) or `follower` (attached to a running one).",
            ["modality", "kind"],
            registry=self.registry,
        )

    def exposition(self) -> bytes:
        if os.environ.get("PROMETHEUS_MULTIPROC_DIR"):
            registry = CollectorRegistry()
            multiprocess.MultiProcessCollector(registry)  # reads every process's files
            return generate_latest(registry)
        return generate_latest(self.registry)


_CONVERTER = re.compile(r"<\w+:(\w+)>")


def _endpoint() -> str:
    # The route template (/v1/jobs/<job_id>), never the raw path: ids would explode cardinality.
    # Without converter names (<job_id:job_id> is <job_id>): a label does not change with them.
    return _CONVERTER.sub(r"<\1>", request.url_rule.rule) if request.url_rule is not None else "unmatched"


def problem_labels(err: ApiError) -> tuple[str, str, str]:
    """(status, type, reason) of a problem response: the type's slug, from the error classes."""
    reason = err.reason if err.reason in REASONS else "other"  # bounded whatever raised it
    return str(err.status), err.slug or "about:blank", reason


def hold_started() -> None:
    """A `Prefer: wait` submit starts holding: its latency stops here, so the histogram measures
    the app's work, not how long the job ran (the hold shows in genqueue_http_requests_in_progress)."""
    g.metrics_held_at = time.perf_counter()


def init_app(app: Flask) -> None:
    metrics: Metrics = app.extensions["genqueue"].metrics

    @app.before_request
    def _start_timer() -> None:
        g.metrics_started = time.perf_counter()
        metrics.in_progress.inc()
        g.metrics_in_progress = True

    @app.teardown_request
    def _done(_exc: BaseException | None) -> None:
        if g.pop("metrics_in_progress", False):  # whatever happened to the request
            metrics.in_progress.dec()

    @app.after_request
    def _record(response: Response) -> Response:
        started = g.pop("metrics_started", None)
        endpoint, method = _endpoint(), request.method
        metrics.requests.labels(endpoint, method, str(response.status_code)).inc()
        problem = g.pop("problem", None)
        if problem is not None:
            metrics.problems.labels(*problem_labels(problem)).inc()
        if started is not None:
            ended = g.pop("metrics_held_at", None) or time.perf_counter()
            metrics.latency.labels(endpoint, method).observe(ended - started)
        return response

    @app.get("/metrics")
    def prometheus_metrics() -> Response:
        return Response(metrics.exposition(), content_type=CONTENT_TYPE_LATEST)
