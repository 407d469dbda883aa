"""The worker's metrics endpoint: its main process serves the metrics of all its pool processes.

With GENQUEUE_WORKER_METRICS_PORT set, `genqueue worker` starts the worker with
PROMETHEUS_MULTIPROC_DIR at its private directory <worker_metrics_dir>/<port>, so every value
the main process and its prefork children record lives in files there, and a scrape reads them
all (prometheus_client multiprocess mode). `worker_init` (main process, before the pool forks)
binds the port, then empties the directory and serves. The port is bound first: a second worker
started on the same port fails to bind and leaves the first one's files alone (it logs and
runs unserved). A prefork child's live gauges go when it exits (worker_process_shutdown, or
at the next scrape if it was killed); its counters and histograms stay in the totals, as its
replacement must not lower them.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import sys
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING, Any

from celery.signals import (
    worker_init,
    worker_process_init,
    worker_process_shutdown,
    worker_ready,
    worker_shutdown,
)

from models import states
from models.settings import Settings
from tasks import metrics
from tasks.celery_app import app_settings

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.metrics_core import Metric

log = logging.getLogger("genqueue.worker")

MULTIPROC_ENV = "PROMETHEUS_MULTIPROC_DIR"
_LIVE_FILE = re.compile(r"gauge_live\w*_(\d+)\.db")


@dataclass
class Endpoint:
    server: ThreadingHTTPServer
    thread: threading.Thread
    directory: Path | None  # the multiprocess files; None: this process's own registry only

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


_endpoint: Endpoint | None = None


class _Unready(BaseHTTPRequestHandler):
    """The handler the port is bound with, replaced before serving starts (binding comes first)."""

    def do_GET(self) -> None:
        self.send_error(503)


class _PruningCollector:
    """MultiProcessCollector over `path`, dropping the live gauges of processes that are gone."""

    def __init__(self, path: Path) -> None:
        from prometheus_client import multiprocess

        self.path = path
        self._collector = multiprocess.MultiProcessCollector(None, str(path))

    def collect(self) -> Iterable[Metric]:
        from prometheus_client import multiprocess

        for name in os.listdir(self.path):
            found = _LIVE_FILE.fullmatch(name)
            if found and not _alive(int(found.group(1))):  # a child killed without its shutdown signal
                multiprocess.mark_process_dead(int(found.group(1)), str(self.path))
        collected: Iterable[Metric] = self._collector.collect()
        return collected


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, under another user
        return True
    return True


def _files_mode(directory: Path) -> bool:
    """Put this process's values in files under `directory` (multiprocess mode); False if it cannot.

    prometheus_client picks its storage at import, and the Celery command imports it (through
    Flower's plugin) before any of our code: files only if PROMETHEUS_MULTIPROC_DIR was set when
    the process started, as `genqueue worker` does (app.supervise.worker_environment), or if it
    is not imported yet. Values open their file under the variable's directory when created.
    """
    values = sys.modules.get("prometheus_client.values")
    if values is not None and not getattr(values.ValueClass, "_multiprocess", False):
        return False
    os.environ[MULTIPROC_ENV] = str(directory)
    return True


def _bind(address: str, port: int) -> ThreadingHTTPServer | None:
    server = ThreadingHTTPServer((address, port), _Unready, bind_and_activate=False)
    server.daemon_threads = True
    try:
        server.server_bind()
        server.server_activate()
    except OSError as exc:
        server.server_close()
        log.error(
            "worker metrics: cannot listen on %s:%d (%s); running without the endpoint", address, port, exc
        )
        return None
    return server


def _registry(directory: Path | None) -> CollectorRegistry:
    from prometheus_client import CollectorRegistry

    if directory is None:
        return metrics.metrics().registry
    registry = CollectorRegistry()
    registry.register(_PruningCollector(directory))
    return registry


def start(settings: Settings) -> Endpoint | None:
    """Serve this worker's metrics on settings.worker_metrics_port (idempotent); None when it cannot."""
    global _endpoint
    if _endpoint is not None:
        return _endpoint
    server = _bind(settings.worker_metrics_address, settings.worker_metrics_port)
    if server is None:
        _no_files()
        return None
    directory: Path | None = None
    if _files_mode(settings.worker_metrics_files):
        # The port is ours, so the directory named after it is too: empty it for this run. No
        # value exists yet (the first is recorded after worker_init), so no file is open in it.
        directory = settings.worker_metrics_files
        shutil.rmtree(directory, ignore_errors=True)
        directory.mkdir(parents=True)
    else:
        log.warning("worker metrics: started without PROMETHEUS_MULTIPROC_DIR (run the worker "
                    "through `genqueue worker`); serving this process's metrics only, without "
                    "those of prefork children")  # fmt: skip
    from prometheus_client import MetricsHandler

    server.RequestHandlerClass = MetricsHandler.factory(_registry(directory))
    thread = threading.Thread(target=server.serve_forever, name="genqueue-metrics", daemon=True)
    thread.start()
    _endpoint = Endpoint(server, thread, directory)
    log.info("worker metrics on http://%s:%d/metrics", settings.worker_metrics_address, _endpoint.port)
    return _endpoint


def stop() -> None:
    """Close the endpoint (worker shutdown; tests). The files stay until the next start empties them."""
    global _endpoint
    endpoint, _endpoint = _endpoint, None
    if endpoint is not None:
        endpoint.server.shutdown()
        endpoint.server.server_close()


def _no_files() -> None:
    """No endpoint of ours: values must not land in a directory another server reads (the one
    a second worker on our port serves, or an inherited one): keep them away from it."""
    if "prometheus_client" not in sys.modules:
        os.environ.pop(MULTIPROC_ENV, None)
    elif os.environ.get(MULTIPROC_ENV):  # files mode already chosen: a directory nobody reads
        os.environ[MULTIPROC_ENV] = tempfile.mkdtemp(prefix="genqueue-metrics-unserved-")


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    settings = app_settings(sender.app)
    if settings.worker_metrics_port:
        start(settings)
    else:
        _no_files()


def _on_process_init(**_: Any) -> None:
    # A prefork child inherits the listening socket with the fork. Closed here, or a child that
    # outlives a killed main process would hold the port, and the restarted worker could not bind.
    if _endpoint is not None:
        _endpoint.server.socket.close()


def _on_process_shutdown(pid: int | None = None, **_: Any) -> None:
    # Sent in a prefork child as it exits; it inherited the endpoint's record from the main process.
    if _endpoint is not None and _endpoint.directory is not None:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid or os.getpid(), str(_endpoint.directory))


def _consumed_queues(consumer: Any) -> list[str]:
    task_consumer = getattr(consumer, "task_consumer", None)
    return sorted({q.name for q in getattr(task_consumer, "queues", ())})


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    # Sent in the main process once the consumer reads its queues (sender: the Consumer). The
    # alert on a queue nobody consumes pairs this with the exporter's depth (docs/OPERATIONS.md).
    global _consumed
    _consumed = _consumed_queues(sender)
    metrics.consuming(_consumed)


_consumed: list[str] = []


def _on_worker_shutdown(**_: Any) -> None:
    metrics.consuming(_consumed, 0.0)  # a worker draining its last tasks takes no new messages
    stop()


def connect() -> None:
    """Hook the endpoint and the finish observer into the worker (idempotent)."""
    states.on_finish(metrics.on_job_finished)
    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="genqueue-metrics-init")
    worker_process_init.connect(_on_process_init, weak=False, dispatch_uid="genqueue-metrics-child-init")
    worker_process_shutdown.connect(_on_process_shutdown, weak=False, dispatch_uid="genqueue-metrics-child")
    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="genqueue-metrics-consuming")
    worker_shutdown.connect(_on_worker_shutdown, weak=False, dispatch_uid="genqueue-metrics-stop")
