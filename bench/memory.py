"""Memory growth: gunicorn worker RSS over N requests and Celery worker RSS over N jobs, vs the baselines."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import psutil

from bench import pipeline
from bench.api import JOB, servers
from bench.common import (
    Process,
    Result,
    machine,
    print_results,
    rss_mb,
    run_load,
    temp_database,
    temp_redis_db,
)


def _python_procs(proc: Process) -> list[psutil.Process]:
    """The process and its Python children (gunicorn workers, pool children), not ffmpeg runs."""
    procs = [psutil.Process(proc.popen.pid), *proc.children()]
    return [p for p in procs if "python" in p.name() or "celery" in " ".join(p.cmdline())]


def _web(
    name: str, base: str, server: Process, job_id: str, args: argparse.Namespace, headers: dict[str, str]
) -> float:
    """KB of RSS growth per 1000 requests (half submits, half status reads) after a warm-up."""
    workers = server.children()
    assert len(workers) == 1, f"expected one gunicorn worker, found {len(workers)}"

    def request(n: int) -> tuple[str, str, object]:
        return ("POST", base + "/v1/jobs", JOB) if n % 2 else ("GET", f"{base}/v1/jobs/{job_id}", None)

    run_load(request, concurrency=args.connections, requests=args.warmup_requests, headers=headers)
    before = rss_mb(workers)
    load = run_load(request, concurrency=args.connections, requests=args.requests, headers=headers)
    after = rss_mb(workers)
    per_k = (after - before) * 1024 / (args.requests / 1000)
    print(f"  {name:<9} worker RSS {before:.1f} -> {after:.1f} MB over {args.requests} requests "
          f"({load.errors} failed): {per_k:+.0f} KB per 1000", flush=True)
    if load.errors:
        raise RuntimeError(f"{name}: {load.errors} requests failed: {load.statuses}")
    return per_k


def _worker(p: pipeline.Pipeline, args: argparse.Namespace) -> float:
    """KB of worker RSS growth (main process + pool children) per 1000 jobs after a warm-up."""
    p.run(args.warmup_jobs)
    procs = _python_procs(p.worker)
    before = rss_mb(procs)
    _seconds, _cpu, failed = p.run(args.jobs)
    after = rss_mb(procs)
    if failed:
        raise RuntimeError(f"{p.name}: {failed} jobs did not succeed")
    per_k = (after - before) * 1024 / (args.jobs / 1000)
    print(f"  {p.name:<9} worker RSS {before:.1f} -> {after:.1f} MB over {args.jobs} jobs "
          f"({len(procs)} processes): {per_k:+.0f} KB per 1000", flush=True)
    return per_k


def run(args: argparse.Namespace) -> list[Result]:
    print(f"memory: {args.requests} requests (1 gunicorn worker), {args.jobs} jobs; {machine()}")
    results = []
    if "web" in args.only:
        # One worker, so every request lands in the process being measured.
        with servers(WEB_CONCURRENCY="1") as srv:
            first = run_load(lambda _n: ("POST", srv.genqueue + "/v1/jobs", JOB), requests=1, concurrency=1,
                             headers=srv.headers)
            assert first.latencies, f"could not submit the job the readers ask about: {first.statuses}"
            job_id = _first_job(srv.db_url)
            base = _web("trivial", srv.trivial, srv.trivial_proc, job_id, args, srv.headers)
            gq = _web("genqueue", srv.genqueue, srv.genqueue_proc, job_id, args, srv.headers)
        goal = "< 1024 KB per 1000 requests"
        results.append(Result("memory", "web RSS growth/1k req", gq, base, "KB", goal, False))
    if "worker" in args.only:
        with temp_database() as db_url, temp_redis_db() as redis_url:
            with pipeline.bare(redis_url, args.pool, args.concurrency) as p:
                base = _worker(p, args)
            with pipeline.genqueue(db_url, redis_url, args.pool, args.concurrency) as p:
                gq = _worker(p, args)
        results.append(Result("memory", "worker RSS growth/1k jobs", gq, base, "KB", higher_is_better=False))
    print_results(results)
    return results


def _first_job(db_url: str) -> str:
    from sqlalchemy import create_engine, select

    from models import Job

    engine = create_engine(db_url)
    with engine.connect() as conn:
        job_id = conn.execute(select(Job.id).limit(1)).scalar_one()
    engine.dispose()
    return str(job_id)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--requests", type=int, default=10_000, help="measured web requests")
    parser.add_argument("--warmup-requests", type=int, default=1_000)
    parser.add_argument("--connections", type=int, default=64, help="concurrent HTTP connections")
    parser.add_argument("--concurrency", type=int, default=2, help="worker pool size")
    parser.add_argument("--jobs", type=int, default=1_000, help="measured pipeline jobs")
    parser.add_argument("--warmup-jobs", type=int, default=50)
    parser.add_argument("--pool", default="prefork", choices=("prefork", "threads", "solo"))
    parser.add_argument("--only", nargs="+", choices=("web", "worker"), default=["web", "worker"])


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
