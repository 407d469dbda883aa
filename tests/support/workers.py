"""Real Celery workers inside the test process (threads pool), with the project's test defaults."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from celery import Celery

from models.settings import Settings


@contextmanager
def in_process_worker(
    app: Celery,
    *,
    concurrency: int = 4,
    queues: list[str] | None = None,
    shutdown_timeout: float = 30,
    loglevel: str = "WARNING",
    **options: Any,
) -> Iterator[Any]:
    """A real worker on `app` (every queue unless `queues`), running the pipeline's tasks; its WorkController.

    No ping check: it would need a result backend, which the project does not use."""
    from celery.contrib.testing.worker import start_worker

    import tasks.pipeline
    import tasks.storyboard  # noqa: F401  and the storyboard's

    if queues is not None:
        options["queues"] = queues
    try:
        with start_worker(
            app,
            pool="threads",
            concurrency=concurrency,
            perform_ping_check=False,
            shutdown_timeout=shutdown_timeout,
            loglevel=loglevel,
            **options,
        ) as controller:
            yield controller
    finally:
        if queues is not None:
            # The worker's -Q selects on the app's own queue table: without this, the app's
            # next worker (a later test's, on a shared app) would consume these queues only.
            app.amqp.queues.select(list(app.amqp.queues))


@contextmanager
def thread_workers(settings: Settings, **overrides: Any) -> Iterator[Celery]:
    """A real worker (threads pool, every queue, maintenance tasks too) on settings with `overrides`."""
    import tasks.maintenance  # noqa: F401  registers the reaper's tasks
    from tasks.celery_app import create_celery

    app = create_celery(settings.model_copy(update=overrides), set_as_current=False)
    with in_process_worker(app):
        yield app


def metric(name: str, **labels: str) -> float:
    """A sample's value in this process's worker metrics (tasks.metrics), which in-process workers
    record into; 0 when it has none yet. Tests compare it before and after."""
    from tasks.metrics import metrics

    for family in metrics().registry.collect():
        for s in family.samples:
            if s.name == name and s.labels == labels:
                return float(s.value)
    return 0.0
