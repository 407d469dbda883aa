"""The pipeline baseline: a bare Celery app with two trivial chained tasks on queues text and video."""

from __future__ import annotations

import functools
import os

import redis
from celery import Celery, chain

FIRST = "bench.first"
SECOND = "bench.second"
DONE_KEY = "bench:chains-done"


def make_app(broker_url: str) -> Celery:
    """Build the app; connects to nothing until used."""
    # Genqueue's delivery settings (late acks, requeue on a lost worker, prefetch 1, no results),
    # but no database, no models, no task events.
    app = Celery("bench_bare", set_as_current=False)
    app.conf.update(
        broker_url=broker_url,
        broker_connection_retry_on_startup=True,
        task_ignore_result=True,
        result_backend=None,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_routes={FIRST: {"queue": "text"}, SECOND: {"queue": "video"}},
        worker_hijack_root_logger=False,
    )

    @app.task(name=FIRST, shared=False)
    def first(n: int) -> None:
        """Does nothing: the text stage's place in the chain."""

    @app.task(name=SECOND, shared=False)
    def second(n: int) -> None:
        """Counts finished chains, so the benchmark can see the last one end."""
        _redis(broker_url).incr(DONE_KEY)

    return app


@functools.cache
def _redis(url: str) -> redis.Redis:
    # Built lazily in the pool child that runs the task, never before the fork.
    return redis.Redis.from_url(url)


def publish(app: Celery, n: int) -> None:
    """Send chain n: first -> second, immutable signatures like Genqueue's."""
    chain(app.signature(FIRST, args=(n,), immutable=True), app.signature(SECOND, args=(n,), immutable=True))()


# `celery -A bench.bare_celery worker` needs a module-level app; building it connects to nothing.
celery = make_app(os.environ.get("BROKER_URL", "redis://127.0.0.1:6379/0"))
