"""HTTP benchmark: POST /v1/jobs and GET /v1/jobs/{id} under gunicorn vs a trivial Flask app, same config."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import psutil

from bench.common import (
    NO_ADMISSION_LIMITS,
    Load,
    Process,
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
    temp_redis_db,
)
from tests.support.procs import pg_bin

JOB = {
    "prompt": "a red fox running through fresh snow",
    "modality": "video",
    "params": {"width": 64, "height": 64, "num_frames": 9, "steps": 2},
}


def _measure(
    name: str,
    base: str,
    server: Process,
    path: Callable[[int], str] | None,
    args: argparse.Namespace,
    headers: dict[str, str],
    backend_cpu: Callable[[], float] | None = None,
) -> Load:
    """Warm up, then load `base` for --duration: submits when `path` is None, else GETs of path(n)."""
    method, body = ("POST", JOB) if path is None else ("GET", None)

    def request(n: int) -> tuple[str, str, object]:
        return method, base + ("/v1/jobs" if path is None else path(n)), body

    if args.warmup > 0:
        run_load(request, concurrency=args.concurrency, duration=args.warmup, headers=headers)
    workers = server.children()
    # The servers behind Genqueue (none for the trivial app): its database's Postgres backends
    # and, when the run has its own, redis-server; read from /proc like the workers.
    backend = backend_cpu or (lambda: 0.0)
    cpu, backend_before = cpu_seconds(workers), backend()
    load = run_load(request, concurrency=args.concurrency, duration=args.duration, headers=headers)
    load.server_cpu = cpu_seconds(workers) - cpu
    load.backend_cpu = backend() - backend_before
    print(f"  {name:<28} {load.summary()}", flush=True)
    return load


def _truncate(db_url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    with engine.begin() as conn:
        # CASCADE: idempotency keys, webhook deliveries and the like refer to jobs.
        conn.execute(text("TRUNCATE job_events, jobs CASCADE"))
    engine.dispose()


def _fill(db_url: str, count: int) -> None:
    """`count` queued normal-priority jobs, older than any seeded after, in one INSERT ... SELECT
    (no publish): a backlog that every polled job's queue position counts."""
    if count <= 0:
        return
    from sqlalchemy import create_engine, text

    from models.tenant import DEFAULT_TENANT_ID

    engine = create_engine(db_url, isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(
            text(
                "INSERT INTO jobs (id, tenant_id, status, modality, prompt, params, priority, progress,"
                " metadata, attempts, recoveries, cached, created_at, updated_at)"
                " SELECT gen_random_uuid(), :tenant, 'queued', 'video', :prompt, CAST(:params AS jsonb),"
                " 'normal', 0, '{}', 0, 0, false, now() - (:n - i) * interval '1 ms', now()"
                " FROM generate_series(1, :n) AS i"
            ),
            {
                "tenant": DEFAULT_TENANT_ID,
                "prompt": JOB["prompt"],
                "params": json.dumps(JOB["params"]),
                "n": count,
            },
        )
        # As autovacuum would soon: statistics, and the visibility map that lets a count over the
        # backlog read the index alone (without it each count visits every row's heap page).
        conn.execute(text("VACUUM (ANALYZE) jobs"))
    engine.dispose()


def _seed(db_url: str, count: int) -> list[str]:
    """`count` queued jobs inserted directly, as a backlog the pollers ask about."""
    from sqlalchemy import create_engine, insert

    from models import Job

    engine = create_engine(db_url)
    ids = [uuid.uuid4() for _ in range(count)]
    rows = [
        {"id": i, "status": "queued", "modality": "video", "prompt": JOB["prompt"], "params": JOB["params"]}
        for i in ids
    ]
    with engine.begin() as conn:
        conn.execute(insert(Job), rows)
    engine.dispose()
    return [str(i) for i in ids]


@dataclass(frozen=True)
class Servers:
    genqueue: str
    trivial: str
    db_url: str
    genqueue_proc: Process
    trivial_proc: Process
    headers: dict[str, str]  # Authorization for Genqueue; sent to the baseline too, alike
    postmaster: psutil.Process | None  # the run's own Postgres cluster, when it has one
    redis: psutil.Process | None  # the run's own redis-server, when it has one

    def backend_cpu(self) -> float:
        """CPU so far of the servers behind Genqueue: its Postgres (the run's own cluster whole,
        else the shared one's backends of its database, those alive now) and its own redis-server."""
        if self.postmaster is not None:
            pg = cluster_cpu_seconds(self.postmaster)
        else:
            pg = cpu_seconds(pg_backends(self.db_url))
        return pg + (cpu_seconds([self.redis]) if self.redis is not None else 0.0)


@contextlib.contextmanager
def servers(**env: str) -> Iterator[Servers]:
    """Genqueue and the trivial app, each under ops/gunicorn.conf.py with the same extra `env`.

    Genqueue gets an API key whose plan has no rate limit or quota, and admission bounds it never
    meets: the benchmark measures the submit and poll path, not the limiters' refusals. Postgres
    and Redis are a cluster and a redis-server of the run's own when pg_ctl and redis-server are
    installed, so their CPU is the run's alone; `GENQUEUE_BENCH_SHARED_SERVERS=1` uses a scratch
    database and a leased db on the shared ones instead (their CPU is then only approximated).
    """
    own = not os.environ.get("GENQUEUE_BENCH_SHARED_SERVERS")
    own_pg = own and pg_bin() is not None
    own_redis = own and shutil.which("redis-server") is not None
    with (
        private_postgres() if own_pg else _shared_postgres() as (db_url, postmaster),
        private_redis() if own_redis else _shared_redis() as (redis_url, redis_proc),
        tempfile.TemporaryDirectory(prefix="gq-bench-") as artifacts,
    ):
        gq_env = {"DATABASE_URL": db_url, "BROKER_URL": redis_url, "GENQUEUE_ARTIFACT_DIR": artifacts}
        gq_env |= NO_ADMISSION_LIMITS
        headers = auth_headers(bench_key(db_url))
        with (
            gunicorn("app:create_app()", gq_env | env, probe="/v1/health") as (genqueue, gq_proc),
            gunicorn("bench.trivial_app:create_app()", env, probe="/v1/health") as (trivial, tr_proc),
        ):
            yield Servers(genqueue, trivial, db_url, gq_proc, tr_proc, headers, postmaster, redis_proc)


@contextlib.contextmanager
def _shared_redis() -> Iterator[tuple[str, psutil.Process | None]]:
    with temp_redis_db() as url:
        yield url, None


@contextlib.contextmanager
def _shared_postgres() -> Iterator[tuple[str, psutil.Process | None]]:
    with temp_database() as url:
        yield url, None


def run(args: argparse.Namespace) -> list[Result]:
    print(
        f"api: {args.concurrency} connections, {args.duration:g} s per measurement, gunicorn workers "
        f"{args.workers or 'default'} x threads {args.threads or 'default'}; {machine()}"
    )
    results: list[Result] = []
    sizing = {"WEB_CONCURRENCY": str(args.workers)} if args.workers else {}
    sizing |= {"WEB_THREADS": str(args.threads)} if args.threads else {}
    with servers(**sizing) as srv:
        genqueue, trivial, db_url = srv.genqueue, srv.trivial, srv.db_url
        if "submit" in args.only:
            _truncate(db_url)
            print("POST /v1/jobs (empty queue at start, no worker: the backlog grows)")
            base = _measure("trivial POST", trivial, srv.trivial_proc, None, args, srv.headers)
            gq = _measure("genqueue POST /v1/jobs", genqueue, srv.genqueue_proc, None, args, srv.headers,
                          srv.backend_cpu)  # fmt: skip
            results += [
                Result("submit", "throughput", gq.rate, base.rate, "req/s", ">= 1000 req/s"),
                Result("submit", "p50 latency", gq.p(50), base.p(50), "ms", higher_is_better=False),
                Result("submit", "p99 latency", gq.p(99), base.p(99), "ms", "< 100 ms", False),
                Result("submit", "web CPU per request", gq.cpu_ms, base.cpu_ms, "ms", higher_is_better=False),
                Result("submit", "server CPU per request", gq.all_cpu_ms, base.all_cpu_ms, "ms",
                       higher_is_better=False),
            ]  # fmt: skip
        if "poll" in args.only:
            for fill in args.fill:
                results += _poll(srv, args, fill)
    print_results(results)
    return results


def _poll(srv: Servers, args: argparse.Namespace, fill: int) -> list[Result]:
    """GETs of random ids among --backlog queued jobs, queued behind `fill` older ones."""
    _truncate(srv.db_url)
    _fill(srv.db_url, fill)
    ids = _seed(srv.db_url, args.backlog)
    label = f" behind {fill} older queued jobs" if fill else ""
    print(f"GET /v1/jobs/{{id}} (random ids among {args.backlog} queued jobs{label})")
    rng = random.Random(1)

    def path(_n: int) -> str:
        return f"/v1/jobs/{rng.choice(ids)}"

    base = _measure("trivial GET", srv.trivial, srv.trivial_proc, path, args, srv.headers)
    gq = _measure("genqueue GET /v1/jobs/{id}", srv.genqueue, srv.genqueue_proc, path, args, srv.headers,
                  srv.backend_cpu)  # fmt: skip
    name = f"poll+{fill}" if fill else "poll"
    return [
        Result(name, "throughput", gq.rate, base.rate, "req/s"),
        Result(name, "p50 latency", gq.p(50), base.p(50), "ms", higher_is_better=False),
        Result(name, "p99 latency", gq.p(99), base.p(99), "ms", higher_is_better=False),
        Result(name, "web CPU per request", gq.cpu_ms, base.cpu_ms, "ms", higher_is_better=False),
        Result(name, "server CPU per request", gq.all_cpu_ms, base.all_cpu_ms, "ms", "<= 3x", False),
    ]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each measurement")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--backlog", type=int, default=1000, help="queued jobs the pollers ask about")
    parser.add_argument(
        "--fill", type=int, nargs="+", default=[0],
        help="older queued jobs inserted ahead of the polled ones (one poll measurement per value, "
        "e.g. --fill 0 20000)",
    )  # fmt: skip
    parser.add_argument("--workers", type=int, help="gunicorn workers for both apps (default: the config's)")
    parser.add_argument("--threads", type=int, help="gunicorn threads per worker for both apps")
    parser.add_argument("--only", nargs="+", choices=("submit", "poll"), default=["submit", "poll"])


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
