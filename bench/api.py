"""HTTP benchmark: POST /v1/jobs and GET /v1/jobs/{id} under gunicorn vs a trivial Flask app, same config."""

from __future__ import annotations

import argparse
import contextlib
import random
import tempfile
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

from bench.common import (
    NO_ADMISSION_LIMITS,
    Load,
    Process,
    Result,
    auth_headers,
    bench_key,
    cpu_seconds,
    gunicorn,
    machine,
    print_results,
    run_load,
    temp_database,
    temp_redis_db,
)

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
) -> Load:
    """Warm up, then load `base` for --duration: submits when `path` is None, else GETs of path(n)."""
    method, body = ("POST", JOB) if path is None else ("GET", None)

    def request(n: int) -> tuple[str, str, object]:
        return method, base + ("/v1/jobs" if path is None else path(n)), body

    if args.warmup > 0:
        run_load(request, concurrency=args.concurrency, duration=args.warmup, headers=headers)
    workers = server.children()
    cpu = cpu_seconds(workers)
    load = run_load(request, concurrency=args.concurrency, duration=args.duration, headers=headers)
    load.server_cpu = cpu_seconds(workers) - cpu
    print(f"  {name:<28} {load.summary()}", flush=True)
    return load


def _truncate(db_url: str) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url)
    with engine.begin() as conn:
        # CASCADE: idempotency keys, webhook deliveries and the like refer to jobs.
        conn.execute(text("TRUNCATE job_events, jobs CASCADE"))
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


@contextlib.contextmanager
def servers(**env: str) -> Iterator[Servers]:
    """Genqueue and the trivial app, each under ops/gunicorn.conf.py with the same extra `env`.

    Genqueue gets an API key whose plan has no rate limit or quota, and admission bounds it never
    meets: the benchmark measures the submit and poll path, not the limiters' refusals.
    """
    with (
        temp_database() as db_url,
        temp_redis_db() as redis_url,
        tempfile.TemporaryDirectory(prefix="gq-bench-") as artifacts,
    ):
        gq_env = {"DATABASE_URL": db_url, "BROKER_URL": redis_url, "GENQUEUE_ARTIFACT_DIR": artifacts}
        gq_env |= NO_ADMISSION_LIMITS
        headers = auth_headers(bench_key(db_url))
        with (
            gunicorn("app:create_app()", gq_env | env, probe="/v1/health") as (genqueue, gq_proc),
            gunicorn("bench.trivial_app:create_app()", env, probe="/v1/health") as (trivial, tr_proc),
        ):
            yield Servers(genqueue, trivial, db_url, gq_proc, tr_proc, headers)


def run(args: argparse.Namespace) -> list[Result]:
    print(f"api: {args.concurrency} connections, {args.duration:g} s per measurement, gunicorn workers "
          f"{args.workers or 'default'} x threads {args.threads or 'default'}; {machine()}")
    results: list[Result] = []
    sizing = {"WEB_CONCURRENCY": str(args.workers)} if args.workers else {}
    sizing |= {"WEB_THREADS": str(args.threads)} if args.threads else {}
    with servers(**sizing) as srv:
        genqueue, trivial, db_url = srv.genqueue, srv.trivial, srv.db_url
        if "submit" in args.only:
            _truncate(db_url)
            print("POST /v1/jobs (empty queue at start, no worker: the backlog grows)")
            base = _measure("trivial POST", trivial, srv.trivial_proc, None, args, srv.headers)
            gq = _measure("genqueue POST /v1/jobs", genqueue, srv.genqueue_proc, None, args, srv.headers)
            results += [
                Result("submit", "throughput", gq.rate, base.rate, "req/s", ">= 1000 req/s"),
                Result("submit", "p50 latency", gq.p(50), base.p(50), "ms", higher_is_better=False),
                Result("submit", "p99 latency", gq.p(99), base.p(99), "ms", "< 100 ms", False),
                Result("submit", "web CPU per request", gq.cpu_ms, base.cpu_ms, "ms", higher_is_better=False),
            ]
        if "poll" in args.only:
            _truncate(db_url)
            ids = _seed(db_url, args.backlog)
            print(f"GET /v1/jobs/{{id}} (random ids among {args.backlog} queued jobs)")
            rng = random.Random(1)

            def path(_n: int) -> str:
                return f"/v1/jobs/{rng.choice(ids)}"

            base = _measure("trivial GET", trivial, srv.trivial_proc, path, args, srv.headers)
            gq = _measure("genqueue GET /v1/jobs/{id}", genqueue, srv.genqueue_proc, path, args, srv.headers)
            results += [
                Result("poll", "throughput", gq.rate, base.rate, "req/s"),
                Result("poll", "p50 latency", gq.p(50), base.p(50), "ms", higher_is_better=False),
                Result("poll", "p99 latency", gq.p(99), base.p(99), "ms", higher_is_better=False),
                Result("poll", "web CPU per request", gq.cpu_ms, base.cpu_ms, "ms", higher_is_better=False),
            ]
    print_results(results)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each measurement")
    parser.add_argument("--concurrency", type=int, default=64)
    parser.add_argument("--backlog", type=int, default=1000, help="queued jobs the pollers ask about")
    parser.add_argument("--workers", type=int, help="gunicorn workers for both apps (default: the config's)")
    parser.add_argument("--threads", type=int, help="gunicorn threads per worker for both apps")
    parser.add_argument("--only", nargs="+", choices=("submit", "poll"), default=["submit", "poll"])


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
