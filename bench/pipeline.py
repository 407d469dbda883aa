"""End-to-end jobs/s through the Genqueue chain (echo models) vs a bare Celery two-task chain."""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from bench.common import (
    Process,
    Result,
    machine,
    print_results,
    python_env,
    spawn,
    temp_database,
    temp_redis_db,
    wait_until,
)

# Small but real: the video stage still encodes an MP4 and a thumbnail per job.
PARAMS = {"max_new_tokens": 16, "temperature": 0.0, "width": 64, "height": 64, "num_frames": 9, "fps": 8,
          "steps": 2}
TERMINAL = ("succeeded", "failed", "canceled")


@dataclass
class Pipeline:
    """A running worker subprocess plus how to push n jobs through it and wait for them all."""

    name: str
    worker: Process
    submit_and_wait: Callable[[int, float], int]  # (n, timeout) -> failed count

    def run(self, n: int) -> tuple[float, int]:
        """Seconds from the first publish until all n have finished, and how many did not succeed."""
        started = time.perf_counter()
        failed = self.submit_and_wait(n, 120 + n * 0.5)
        return time.perf_counter() - started, failed


def _worker_args(app: str, queues: str, pool: str, concurrency: int) -> list[str]:
    name = f"bench-{uuid.uuid4().hex[:6]}@%h"
    return [sys.executable, "-m", "celery", "-A", app, "worker", "-Q", queues, "-P", pool,
            "-c", str(concurrency), "-n", name, "-l", "WARNING"]


def _watch(worker: Process, check: Callable[[], bool]) -> Callable[[], bool]:
    def alive_and_done() -> bool:
        if worker.popen.poll() is not None:
            raise RuntimeError(f"worker exited:\n{worker.tail()}")
        return check()

    return alive_and_done


@contextlib.contextmanager
def genqueue(db_url: str, redis_url: str, pool: str, concurrency: int) -> Iterator[Pipeline]:
    """A `tasks.worker` subprocess on all pipeline queues with the echo models."""
    from sqlalchemy import func, insert, select

    from models import Job
    from models.db import make_engine
    from models.settings import Settings
    from tasks.celery_app import create_celery
    from tasks.contract.publish import publish_job

    with tempfile.TemporaryDirectory(prefix="gq-bench-") as artifacts:
        env = python_env(
            DATABASE_URL=db_url,
            BROKER_URL=redis_url,
            GENQUEUE_TEXT_MODEL="echo",
            GENQUEUE_VIDEO_MODEL="echo",
            GENQUEUE_ARTIFACT_DIR=artifacts,
        )
        args = _worker_args("tasks.worker", "text,video,default", pool, concurrency)
        with spawn(args, env, "celery-genqueue") as worker:
            app = create_celery(Settings(database_url=db_url, broker_url=redis_url), set_as_current=False)
            engine = make_engine(db_url, pool_size=2)

            def submit_and_wait(n: int, timeout: float) -> int:
                ids = [uuid.uuid4() for _ in range(n)]
                rows = [{"id": i, "status": "queued", "modality": "video", "prompt": f"a fox, take {k}",
                         "params": PARAMS | {"seed": k}} for k, i in enumerate(ids)]
                with engine.begin() as conn:  # the API's part, not timed by the caller's clock
                    conn.execute(insert(Job), rows)
                for i in ids:
                    publish_job(app, i, "video", "normal")
                # Runs are sequential and the database is this benchmark's own: count the whole table.
                with engine.connect() as conn:
                    target = int(conn.execute(select(func.count()).select_from(Job)).scalar_one())

                def count(*where: object) -> int:
                    with engine.connect() as conn:
                        return int(conn.execute(select(func.count()).where(*where)).scalar_one())

                wait_until(_watch(worker, lambda: count(Job.status.in_(TERMINAL)) >= target), timeout, "jobs",
                           interval=0.1)
                return count(Job.status.in_(("failed", "canceled")))

            try:
                yield Pipeline("genqueue", worker, submit_and_wait)
            finally:
                engine.dispose()


@contextlib.contextmanager
def bare(redis_url: str, pool: str, concurrency: int) -> Iterator[Pipeline]:
    """A `bench.bare_celery` worker subprocess on queues text and video."""
    import redis

    from bench import bare_celery

    env = python_env(BROKER_URL=redis_url)
    args = _worker_args("bench.bare_celery", "text,video", pool, concurrency)
    with spawn(args, env, "celery-bare") as worker:
        app = bare_celery.make_app(redis_url)
        client = redis.Redis.from_url(redis_url)

        def done() -> int:
            return int(client.get(bare_celery.DONE_KEY) or 0)

        def submit_and_wait(n: int, timeout: float) -> int:
            target = done() + n
            for k in range(n):
                bare_celery.publish(app, k)
            wait_until(_watch(worker, lambda: done() >= target), timeout, "chains", interval=0.1)
            return 0

        yield Pipeline("bare", worker, submit_and_wait)


def _measure(pipeline: Pipeline, args: argparse.Namespace) -> float:
    pipeline.run(args.warmup)  # also waits out the worker's start
    seconds, failed = pipeline.run(args.jobs)
    rate = args.jobs / seconds
    print(f"  {pipeline.name:<9} {args.jobs} jobs in {seconds:.2f} s: {rate:.1f} jobs/s", flush=True)
    if failed:
        raise RuntimeError(f"{failed} {pipeline.name} jobs did not succeed:\n{pipeline.worker.tail()}")
    return rate


def run(args: argparse.Namespace) -> list[Result]:
    print(f"pipeline: {args.jobs} jobs, {args.pool} pool x {args.concurrency}; {machine()}")
    with temp_database() as db_url, temp_redis_db() as redis_url:
        with bare(redis_url, args.pool, args.concurrency) as p:
            base = _measure(p, args)
        with genqueue(db_url, redis_url, args.pool, args.concurrency) as p:
            gq = _measure(p, args)
    results = [Result("pipeline", "jobs/s (text->video)", gq, base, "jobs/s", ">= 0.7x bare")]
    print_results(results)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=500, help="jobs (chains) per measurement")
    parser.add_argument("--warmup", type=int, default=20, help="jobs run first, not measured")
    parser.add_argument("--pool", default="prefork", choices=("prefork", "threads", "solo"))
    parser.add_argument("--concurrency", type=int, default=2)


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
