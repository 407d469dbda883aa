"""Overload check: 1000 concurrent connections against gunicorn; every answer must be 2xx, 429 or 503.

Starts its own throwaway Redis (free port) and a scratch Postgres database, migrates it, makes
API keys for several tenants (a small rate limit, so 429s happen), starts gunicorn with the
production config on a free port and no workers behind it (jobs pile up until admission control
answers 503), then opens N connections from one asyncio client and keeps each busy for D seconds
with a mix of submits, reads, listings and health checks. It counts status codes, transport
errors (refused, reset, timed out) and malformed answers (an error that is not problem+json).
Exit status 0 only when every request got a well-formed 2xx/429/503.

    PYTHONPATH=$PWD python bench/overload.py --connections 1000 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import aiohttp
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("GENQUEUE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
ALLOWED = {200, 202, 429, 503}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing listens on port {port} after {timeout} s")


@contextmanager
def throwaway_redis() -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
        stdout=subprocess.DEVNULL,
    )
    try:
        wait_port(port, 10)
        yield f"redis://127.0.0.1:{port}/0"
    finally:
        proc.terminate()
        proc.wait(10)


@contextmanager
def scratch_database() -> Iterator[str]:
    from models.migrate import upgrade

    name = f"gq_overload_{uuid.uuid4().hex[:8]}"
    url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    upgrade(url)
    try:
        yield url
    finally:
        admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


def make_keys(url: str, tenants: int, rate_limit: str) -> list[str]:
    from models.db import make_engine, make_session_factory, transaction
    from models.keys import create_key, set_plan

    engine = make_engine(url, pool_size=1)
    keys = []
    with transaction(make_session_factory(engine)) as s:
        for i in range(tenants):
            set_plan(s, f"load-{i}", {"rate_limit": rate_limit})
            keys.append(create_key(s, f"load-{i}")[1])
    engine.dispose()
    return keys


@contextmanager
def gunicorn(env: dict[str, str], port: int, workers: int, threads: int) -> Iterator[subprocess.Popen[bytes]]:
    fd, log_path = tempfile.mkstemp(prefix="overload-gunicorn-", suffix=".log")
    log = os.fdopen(fd, "wb")
    cmd = [
        sys.executable, "-m", "gunicorn", "-c", str(ROOT / "ops/gunicorn.conf.py"),
        # Worker recycling would close busy keep-alive connections mid-run: off for the measurement.
        "--max-requests", "0", "app:create_app()",
    ]  # fmt: skip
    env = {**os.environ, **env, "PORT": str(port), "HOST": "127.0.0.1"}
    env |= {"WEB_CONCURRENCY": str(workers), "WEB_THREADS": str(threads), "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_port(port, 30)
        yield proc
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()
        print(f"gunicorn log: {log_path}", file=sys.stderr)


class Tally:
    def __init__(self) -> None:
        self.status: Counter[int] = Counter()
        self.by_route: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.malformed: list[str] = []
        self.latencies: list[float] = []
        self.job_ids: dict[str, list[str]] = {}  # per key: another tenant's job is a 404

    def summary(self, seconds: float) -> dict[str, Any]:
        lat = sorted(self.latencies)

        def pct(p: float) -> float | None:
            return round(lat[min(len(lat) - 1, int(p * len(lat)))] * 1000, 1) if lat else None

        total = sum(self.status.values())
        return {
            "requests": total,
            "per_second": round(total / seconds, 1),
            "status": {str(k): v for k, v in sorted(self.status.items())},
            "by_route": dict(self.by_route),
            "transport_errors": dict(self.errors),
            "malformed": len(self.malformed),
            "malformed_examples": self.malformed[:5],
            "latency_ms": {"p50": pct(0.5), "p90": pct(0.9), "p99": pct(0.99), "max": pct(1.0)},
        }


async def one_request(session: aiohttp.ClientSession, base: str, key: str, tally: Tally) -> None:
    roll = random.random()
    headers = {"Authorization": f"Bearer {key}"}
    if roll < 0.35:
        route, method, path = "submit", "POST", "/v1/jobs"
        body: Any = {"prompt": "a fox in the snow", "modality": random.choice(["text", "video"])}
    elif roll < 0.75 and tally.job_ids.get(key):
        route, method, path, body = "get", "GET", f"/v1/jobs/{random.choice(tally.job_ids[key])}", None
    elif roll < 0.9:
        route, method, path, body = "list", "GET", "/v1/jobs?limit=5", None
    else:
        route, method, path, body = "health", "GET", "/v1/health", None
    started = time.perf_counter()
    try:
        async with session.request(method, base + path, json=body, headers=headers) as resp:
            raw = await resp.read()
            tally.latencies.append(time.perf_counter() - started)
            tally.status[resp.status] += 1
            tally.by_route[f"{route} {resp.status}"] += 1
            ok = resp.status in ALLOWED
            if resp.status >= 400:
                ok = ok and resp.content_type == "application/problem+json" and "Retry-After" in resp.headers
                problem = json.loads(raw) if ok else {}
                ok = ok and problem.get("status") == resp.status and "type" in problem
            elif route == "submit":
                tally.job_ids.setdefault(key, []).append(json.loads(raw)["id"])
            if not ok:
                tally.malformed.append(f"{method} {path} -> {resp.status} {raw[:200]!r}")
    except (TimeoutError, aiohttp.ClientError, ValueError) as exc:
        tally.errors[type(exc).__name__] += 1


async def load(base: str, keys: list[str], connections: int, duration: float, tally: Tally) -> float:
    # One connection per client coroutine: `limit` caps the pool at exactly N open sockets.
    connector = aiohttp.TCPConnector(limit=connections, force_close=False)
    # Generous: on a loaded machine a request may wait long in the server's queue; a timeout
    # is still counted as a transport error, never hidden.
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        started = time.monotonic()
        deadline = started + duration

        async def client(i: int) -> None:
            key = keys[i % len(keys)]
            while time.monotonic() < deadline:
                await one_request(session, base, key, tally)

        await asyncio.gather(*(client(i) for i in range(connections)))
        return time.monotonic() - started


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--connections", type=int, default=1000)
    parser.add_argument("--duration", type=float, default=20.0, help="seconds of load")
    parser.add_argument("--tenants", type=int, default=3, help="keys (one per tenant) the load spreads over")
    parser.add_argument("--rate-limit", default="20/second;600/minute", help="each key's plan")
    parser.add_argument("--text-backlog", type=int, default=300, help="admission bound (queued jobs)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--json", type=Path, help="write the summary here too")
    args = parser.parse_args()
    if shutil.which("redis-server") is None:
        print("redis-server not found", file=sys.stderr)
        return 2
    with throwaway_redis() as redis_url, scratch_database() as db_url:
        keys = make_keys(db_url, args.tenants, args.rate_limit)
        env = {
            "DATABASE_URL": db_url,
            "BROKER_URL": redis_url,
            "GENQUEUE_ADMISSION_MAX_TEXT_BACKLOG": str(args.text_backlog),
            "GENQUEUE_ADMISSION_MAX_VIDEO_BACKLOG": str(args.text_backlog),
            "GENQUEUE_TEXT_MODEL": "echo",
            "GENQUEUE_VIDEO_MODEL": "echo",
        }
        port = free_port()
        with gunicorn(env, port, args.workers, args.threads):
            tally = Tally()
            base = f"http://127.0.0.1:{port}"
            seconds = asyncio.run(load(base, keys, args.connections, args.duration, tally))
    summary = {"connections": args.connections, "duration_s": round(seconds, 1), **tally.summary(seconds)}
    summary["verdict"] = (
        "ok"
        if not tally.errors and not tally.malformed and set(tally.status) <= ALLOWED and tally.status
        else "FAILED"
    )
    print(json.dumps(summary, indent=2))
    if args.json:
        args.json.write_text(json.dumps(summary, indent=2))
    return 0 if summary["verdict"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
