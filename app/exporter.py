"""The metrics exporter process (`genqueue exporter`): broker queue depths, jobs and webhook backlog.

Each scrape reads every source afresh (a custom Collector, nothing cached), each source in its
own thread under one deadline (`exporter_timeout_s`): a broker or database that is down or
hangs shows as `genqueue_exporter_up{source=...} 0` and the scrape still answers in time.
Labels are bounded: queue, priority, status, modality and source come from fixed sets.
The metrics are listed in docs/OPERATIONS.md ("Metrics").
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session, sessionmaker

from app.queue_depth import QueueDepths
from models.db import make_engine, make_session_factory
from models.job import ACTIVE, JobStatus, Modality
from models.monitoring import active_jobs, estimated_jobs, webhook_backlog
from models.settings import Settings

log = logging.getLogger("genqueue.exporter")
SOURCES = ("broker", "database")


class ExporterCollector(Collector):
    """Reads the broker and the database on every collect(), each within the deadline."""

    def __init__(self, settings: Settings) -> None:
        self.timeout_s = settings.exporter_timeout_s
        self.depths = QueueDepths(settings.broker_url, self.timeout_s)
        # One connection is enough (scrapes are seconds apart); it fails fast when Postgres is away.
        self.engine: Engine = make_engine(
            settings.database_url,
            pool_size=1,
            max_overflow=1,
            connect_timeout=max(1, math.ceil(self.timeout_s)),
        )
        self.sessions: sessionmaker[Session] = make_session_factory(self.engine)

    def describe(self) -> Iterable[Metric]:
        return []  # registration must not read the sources

    def collect(self) -> Iterable[Metric]:
        readers: dict[str, Callable[[], list[Metric]]] = {"broker": self._broker, "database": self._database}
        up = GaugeMetricFamily(
            "genqueue_exporter_up", "1 if the source answered this scrape in time.", labels=["source"]
        )
        took = GaugeMetricFamily(
            "genqueue_exporter_scrape_duration_seconds",
            "How long this scrape read each source.",
            labels=["source"],
        )
        pool = ThreadPoolExecutor(len(readers), thread_name_prefix="exporter")
        started = time.monotonic()
        futures = {name: pool.submit(_timed, read) for name, read in readers.items()}
        deadline = started + self.timeout_s
        try:
            for name, future in futures.items():
                try:
                    families, seconds = future.result(timeout=max(0.0, deadline - time.monotonic()))
                except FutureTimeout:
                    log.warning("exporter: %s did not answer within %.1f s", name, self.timeout_s)
                    families, seconds, ok = [], time.monotonic() - started, False
                except Exception as exc:  # down, refused, misconfigured: reported, never raised
                    log.warning("exporter: %s failed: %s: %s", name, type(exc).__name__, exc)
                    families, seconds, ok = [], time.monotonic() - started, False
                else:
                    ok = True
                yield from families
                up.add_metric([name], 1.0 if ok else 0.0)
                took.add_metric([name], seconds)
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # a hung read ends with its socket timeout
        yield up
        yield took

    def _broker(self) -> list[Metric]:
        depth = GaugeMetricFamily(
            "genqueue_queue_depth",
            "Messages waiting in the broker queue (not yet delivered to a worker), by priority level.",
            labels=["queue", "priority"],
        )
        for (queue, priority), n in sorted(self.depths.read().items()):
            depth.add_metric([queue, priority], float(n))
        return [depth]

    def _database(self) -> list[Metric]:
        with self.sessions() as s, s.begin():
            if self.engine.dialect.name == "postgresql":  # a slow statement gives up with the scrape
                s.execute(text(f"SET LOCAL statement_timeout = {int(self.timeout_s * 1000)}"))
            active = active_jobs(s)
            estimated = estimated_jobs(s)
            messages, pending = webhook_backlog(s)
        jobs = GaugeMetricFamily(
            "genqueue_jobs",
            "Queued and running jobs by status and modality (exact).",
            labels=["status", "modality"],
        )
        for status in sorted(ACTIVE):
            for modality in Modality:
                jobs.add_metric([status, modality.value], float(active.get((status, modality.value), 0)))
        approx = GaugeMetricFamily(
            "genqueue_jobs_estimated",
            "Jobs by status, every status, from the planner's statistics (approximate, refreshed by "
            "ANALYZE; NaN before the first).",
            labels=["status"],
        )
        for status in JobStatus:
            value = math.nan if estimated is None else float(estimated.get(status.value, 0))
            approx.add_metric([status.value], value)
        outbox = GaugeMetricFamily(
            "genqueue_webhook_outbox_messages", "Webhook outbox messages not fanned out yet.", value=messages
        )
        deliveries = GaugeMetricFamily(
            "genqueue_webhook_deliveries_pending",
            "Webhook deliveries waiting for their (next) attempt.",
            value=pending,
        )
        return [jobs, approx, outbox, deliveries]

    def close(self) -> None:
        self.depths.close()
        self.engine.dispose()


def _timed(read: Callable[[], list[Metric]]) -> tuple[list[Metric], float]:
    started = time.monotonic()
    return read(), time.monotonic() - started


def serve(settings: Settings, host: str, port: int, stop: threading.Event) -> None:
    """Serve /metrics on host:port until `stop` is set."""
    registry = CollectorRegistry()
    collector = ExporterCollector(settings)
    registry.register(collector)
    server, thread = start_http_server(port, addr=host, registry=registry)
    log.info("exporter serving /metrics on %s:%d", host, port)
    try:
        stop.wait()
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
        collector.close()
