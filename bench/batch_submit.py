"""Batch submit benchmark: jobs/s accepted and server CPU per job, POST /v1/jobs/batch next to POST /v1/jobs.

Both against the same gunicorn in the same run, single submits first (the baseline), then
batches. Server CPU is read from /proc for every process that serves a submit: the gunicorn
workers, Postgres (a cluster of the run's own when pg_ctl is installed, else this database's
backends on the shared server) and a private redis-server (the broker, rate limiter and quota
store), so it is this benchmark's alone (bench.common). It is far less sensitive to a busy
machine than the rates.

    PYTHONPATH=$PWD python -m bench.batch_submit [--batch 500] [--duration 10]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass

import psutil

from bench.common import (
    NO_ADMISSION_LIMITS,
    Result,
    auth_headers,
    bench_key,
    cluster_cpu_seconds,
    cpu_seconds,
    gunicorn,
    machine,
    pg_backends,
    print_results,
    private_postgres,
    private_redis,
    run_load,
    temp_database,
)
from tests.support.procs import pg_bin

JOB = {
    "prompt": "a red fox running through fresh snow",
    "modality": "video",
    "params": {"width": 64, "height": 64, "num_frames": 9, "steps": 2},
}


@contextmanager
def _postgres() -> Iterator[tuple[str, psutil.Process | None]]:
    """The run's own cluster (its postmaster) when pg_ctl is installed, else a scratch database."""
    if pg_bin() is not None:
        with private_postgres() as (url, postmaster):
            yield url, postmaster
    else:
        with temp_database() as url:
            yield url, None


@dataclass
class Measured:
    name: str
    jobs: int
    elapsed: float
    cpu: dict[str, float]  # CPU seconds by server: web, postgres, redis
    p50_ms: float
    p99_ms: float

    @property
    def jobs_per_s(self) -> float:
        return self.jobs / self.elapsed if self.elapsed else 0.0

    def cpu_ms_per_job(self, part: str | None = None) -> float:
        total = self.cpu[part] if part else sum(self.cpu.values())
        return 1000 * total / self.jobs if self.jobs else float("nan")

    def line(self) -> str:
        parts = ", ".join(f"{k} {self.cpu_ms_per_job(k):.3f}" for k in self.cpu)
        return (
            f"  {self.name:<26} {self.jobs} jobs in {self.elapsed:.1f} s: {self.jobs_per_s:.0f} jobs/s, "
            f"server CPU {self.cpu_ms_per_job():.3f} ms/job ({parts}), request p50 {self.p50_ms:.0f} ms, "
            f"p99 {self.p99_ms:.0f} ms"
        )


def _measure(
    name: str,
    url: str,
    body: bytes,
    jobs_per_request: int,
    concurrency: int,
    args: argparse.Namespace,
    servers: Callable[[], dict[str, float]],
    headers: dict[str, str],
) -> Measured:
    def request(_n: int) -> tuple[str, str, object]:
        return "POST", url, body

    run_load(request, concurrency=concurrency, duration=args.warmup, headers=headers)
    before = servers()  # after the warm-up: the pools' backends exist now
    load = run_load(request, concurrency=concurrency, duration=args.duration, headers=headers)
    after = servers()
    cpu = {part: after[part] - before[part] for part in after}
    if load.errors:
        raise RuntimeError(f"{name}: {load.errors} requests failed: {load.statuses}")
    measured = Measured(
        name, len(load.latencies) * jobs_per_request, load.elapsed, cpu, load.p(50), load.p(99)
    )
    print(measured.line(), flush=True)
    return measured


def run(args: argparse.Namespace) -> list[Result]:
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server not found")
    print(
        f"batch submit: batches of {args.batch} at {args.batch_concurrency} connections, single submits "
        f"at {args.concurrency}, {args.duration:g} s each; {machine()}"
    )
    with (
        _postgres() as (db_url, postmaster),
        private_redis() as (redis_url, redis_proc),
        tempfile.TemporaryDirectory(prefix="gq-bench-") as artifacts,
    ):
        env = {"DATABASE_URL": db_url, "BROKER_URL": redis_url, "GENQUEUE_ARTIFACT_DIR": artifacts}
        env |= NO_ADMISSION_LIMITS
        env |= {"WEB_CONCURRENCY": str(args.workers)} if args.workers else {}
        headers = auth_headers(bench_key(db_url)) | {"Content-Type": "application/json"}
        with gunicorn("app:create_app()", env, probe="/v1/health") as (base, web):

            def servers() -> dict[str, float]:
                """CPU seconds so far of each server behind the submits."""
                pg = (
                    cluster_cpu_seconds(postmaster)
                    if postmaster is not None
                    else cpu_seconds(pg_backends(db_url))
                )
                return {
                    "web": cpu_seconds(web.children()),
                    "postgres": pg,
                    "redis": cpu_seconds([redis_proc]),
                }

            single = json.dumps(JOB).encode()
            batch = json.dumps({"jobs": [JOB] * args.batch}).encode()
            one = _measure(
                "POST /v1/jobs", f"{base}/v1/jobs", single, 1, args.concurrency, args, servers, headers
            )
            many = _measure(
                f"POST /v1/jobs/batch ({args.batch})", f"{base}/v1/jobs/batch", batch, args.batch,
                args.batch_concurrency, args, servers, headers,
            )  # fmt: skip
    print(f"load avg at the end: {os.getloadavg()[0]:.2f}")
    results = [
        Result("batch", "jobs accepted per s", many.jobs_per_s, one.jobs_per_s, "jobs/s", ">= 5000 jobs/s"),
        Result(
            "batch",
            "server CPU per job",
            many.cpu_ms_per_job(),
            one.cpu_ms_per_job(),
            "ms",
            "<= 0.3 ms",
            False,
        ),
    ]
    results += [
        Result("batch", f"{part} CPU per job", many.cpu_ms_per_job(part), one.cpu_ms_per_job(part), "ms",
               higher_is_better=False)
        for part in many.cpu
    ]  # fmt: skip
    print_results(results)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each measurement")
    parser.add_argument("--batch", type=int, default=500, help="jobs per batch (at most 500)")
    parser.add_argument("--concurrency", type=int, default=64, help="connections for single submits")
    parser.add_argument("--batch-concurrency", type=int, default=4, help="connections for batches")
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: the config's)")


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
