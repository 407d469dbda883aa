"""End-to-end jobs/s and server CPU per job through the Genqueue chain (echo models) vs a bare Celery chain.

Server CPU: the worker process and its pool children, the run's own redis-server and (Genqueue)
its own Postgres cluster, user + system from /proc, over the measured jobs only (not the warm-up).
The bare chain has no database: what a Genqueue job adds there (its transitions, events, the
published and completed rows) is part of its cost.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import cast

import psutil

from bench.common import (
    Process,
    Result,
    cluster_cpu_seconds,
    cpu_seconds,
    machine,
    print_results,
    private_postgres,
    private_redis,
    python_env,
    spawn,
    tree_cpu_seconds,
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
    prepare: Callable[[int], object]  # (n) -> a batch of n jobs ready to publish (untimed)
    publish_and_wait: Callable[[object, float], int]  # (batch, timeout) -> failed count
    servers: dict[str, Callable[[], float]]  # CPU seconds so far of each server beside the worker

    def cpu(self) -> dict[str, float]:
        """CPU seconds so far: the worker (its pool children too, live or reaped), each server."""
        worker = tree_cpu_seconds(psutil.Process(self.worker.popen.pid))
        return {"worker": worker} | {name: f() for name, f in self.servers.items()}

    def run(self, n: int) -> tuple[float, dict[str, float], int]:
        """Seconds and CPU seconds per process kind from the first publish until all n have
        finished, and how many did not succeed."""
        batch = self.prepare(n)
        cpu, started = self.cpu(), time.perf_counter()
        failed = self.publish_and_wait(batch, 120 + n * 0.5)
        seconds, after = time.perf_counter() - started, self.cpu()
        return seconds, {k: after[k] - cpu[k] for k in cpu}, failed


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
def genqueue(
    db_url: str,
    redis_url: str,
    pool: str,
    concurrency: int,
    servers: dict[str, Callable[[], float]] | None = None,
    accounts: str | None = None,
) -> Iterator[Pipeline]:
    """A `tasks.worker` subprocess on all pipeline queues with the echo models; `accounts`: a
    folder where `bench.worker_accounts` (the same worker, its pieces timed) writes its totals."""
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
            **({"GENQUEUE_BENCH_ACCOUNTS_DIR": accounts} if accounts else {}),
        )
        module = "bench.worker_accounts" if accounts else "tasks.worker"
        args = _worker_args(module, "text,video,default", pool, concurrency)
        with spawn(args, env, "celery-genqueue") as worker:
            app = create_celery(Settings(database_url=db_url, broker_url=redis_url), set_as_current=False)
            engine = make_engine(db_url, pool_size=2)

            def prepare(n: int) -> object:
                ids = [uuid.uuid4() for _ in range(n)]
                rows = [{"id": i, "status": "queued", "modality": "video", "prompt": f"a fox, take {k}",
                         "params": PARAMS | {"seed": k}} for k, i in enumerate(ids)]
                with engine.begin() as conn:  # the API's part, measured by bench.api, not here
                    conn.execute(insert(Job), rows)
                return ids

            def publish_and_wait(batch: object, timeout: float) -> int:
                ids = cast("list[uuid.UUID]", batch)
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
                yield Pipeline("genqueue", worker, prepare, publish_and_wait, servers or {})
            finally:
                engine.dispose()


@contextlib.contextmanager
def bare(
    redis_url: str, pool: str, concurrency: int, servers: dict[str, Callable[[], float]] | None = None
) -> Iterator[Pipeline]:
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

        def publish_and_wait(batch: object, timeout: float) -> int:
            n = cast(int, batch)
            target = done() + n
            for k in range(n):
                bare_celery.publish(app, k)
            wait_until(_watch(worker, lambda: done() >= target), timeout, "chains", interval=0.1)
            return 0

        yield Pipeline("bare", worker, lambda n: n, publish_and_wait, servers or {})


def _measure(pipelines: Sequence[Pipeline], args: argparse.Namespace) -> list[tuple[float, float]]:
    """Jobs/s and server CPU ms per job of each pipeline, after a warm-up: the jobs in `rounds`
    equal parts, the pipelines taking turns, so a slower minute of a shared machine falls on all
    of them alike (the ratios are what is read)."""
    for p in pipelines:
        p.run(args.warmup)  # also waits out the worker's start
    part = max(1, args.jobs // args.rounds)
    seconds = [0.0 for _ in pipelines]
    cpu: list[dict[str, float]] = [{} for _ in pipelines]
    failed = [0 for _ in pipelines]
    for _ in range(args.rounds):
        for at, p in enumerate(pipelines):
            s, cpu_s, f = p.run(part)
            seconds[at] += s
            failed[at] += f
            for k, v in cpu_s.items():
                cpu[at][k] = cpu[at].get(k, 0.0) + v
    n, out = part * args.rounds, []
    for at, p in enumerate(pipelines):
        rate, cpu_ms = n / seconds[at], 1000 * sum(cpu[at].values()) / n
        parts = ", ".join(f"{k} {1000 * v / n:.2f}" for k, v in cpu[at].items())
        print(f"  {p.name:<9} {n} jobs in {seconds[at]:.2f} s: {rate:.1f} jobs/s, "
              f"server CPU {cpu_ms:.2f} ms per job ({parts})", flush=True)  # fmt: skip
        if failed[at]:
            raise RuntimeError(f"{failed[at]} {p.name} jobs did not succeed:\n{p.worker.tail()}")
        out.append((rate, cpu_ms))
    return out


def run(args: argparse.Namespace) -> list[Result]:
    if args.account and args.pool != "prefork":
        raise SystemExit("--account needs the prefork pool (see bench.worker_accounts)")
    print(f"pipeline: {args.jobs} jobs in {args.rounds} turns each, {args.pool} pool x {args.concurrency}; "
          f"{machine()}")  # fmt: skip
    # A redis-server and a Postgres cluster of this run's own: their CPU is this run's alone.
    with private_postgres() as (db_url, postmaster), private_redis() as (redis_url, redis_proc):
        redis = {"redis": lambda: cpu_seconds([redis_proc])}
        servers = redis | {"postgres": lambda: cluster_cpu_seconds(postmaster)}
        # Both workers up at once: the one whose turn it is not waits on its empty queues. Their
        # queues share names: the bare chain's live in another database of the same server.
        bare_url = redis_url.rsplit("/", 1)[0] + "/1"
        with tempfile.TemporaryDirectory(prefix="gq-accounts-") as accounts:
            with (
                bare(bare_url, args.pool, args.concurrency, redis) as b,
                genqueue(
                    db_url,
                    redis_url,
                    args.pool,
                    args.concurrency,
                    servers,
                    accounts if args.account else None,
                ) as g,
            ):
                (base_rate, base_cpu), (rate, cpu) = _measure([b, g], args)
            if args.account:  # the worker has stopped: every pool process wrote its last totals
                _print_accounts(accounts)
    results = [
        Result("pipeline", "jobs/s (text->video)", rate, base_rate, "jobs/s", ">= 0.7x bare"),
        Result("pipeline", "server CPU per job", cpu, base_cpu, "ms", "<= 3x bare", higher_is_better=False),
    ]
    print_results(results)
    return results


def _print_accounts(folder: str) -> None:
    """The pool's thread CPU per job by piece (bench.worker_accounts), warm-up jobs included."""
    from bench import worker_accounts

    totals = worker_accounts.read(folder)
    if not totals.get("task"):
        print("  (no accounts written: fewer than 10 tasks per pool process)")
        return
    jobs = totals["task"][1] / 2  # two tasks per job: text, video
    task_ms = 1000 * totals["task"][0] / jobs
    parts = {piece: 1000 * seconds / jobs for piece, (seconds, _) in totals.items() if piece != "task"}
    print(f"  genqueue pool, thread CPU per job over {jobs:.0f} jobs: tasks {task_ms:.2f} ms = "
          + ", ".join(f"{piece} {ms:.2f}" for piece, ms in sorted(parts.items(), key=lambda kv: -kv[1]))
          + f", the rest {task_ms - sum(parts.values()):.2f}")  # fmt: skip


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--jobs", type=int, default=500, help="jobs (chains) per measurement")
    parser.add_argument("--warmup", type=int, default=20, help="jobs run first, not measured")
    parser.add_argument("--rounds", type=int, default=5, help="turns the pipelines take at the jobs")
    parser.add_argument("--pool", default="prefork", choices=("prefork", "threads", "solo"))
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument(
        "--account", action="store_true", help="also print where the Genqueue pool's CPU per job goes"
    )


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
