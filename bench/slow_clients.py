"""Hostile connections: idle, slow-header and slow-body clients held against gunicorn, one good client.

Starts Genqueue under ops/gunicorn.conf.py (scratch database, Redis db, no workers) and measures
a well-behaved client (an open loop of GET /v1/health, GET /v1/jobs/{id} and POST /v1/jobs, a few
keep-alive connections) first alone, then while N idle connections (send nothing), N slow-header
clients (a header byte per second) and N slow-body clients (a body byte per second) are held for
D seconds. A hostile connection the server closes is opened again at once, so the attack holds
its count for the whole run. Reports the good client's p50/p99/max and failures in both phases,
the server's CPU per good request, and what the server did to the attackers.

    PYTHONPATH=$PWD python -m bench.slow_clients --idle 1000 --slow-headers 100 --slow-bodies 100 \
        --duration 60
    PYTHONPATH=$PWD python -m bench.slow_clients --worker-class gthread ...   # the previous setup
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field

from bench.common import (
    NO_ADMISSION_LIMITS,
    auth_headers,
    bench_key,
    cpu_seconds,
    gunicorn,
    machine,
    percentile,
    temp_database,
    temp_redis_db,
)

JOB = {"prompt": "a lighthouse in a storm", "modality": "text", "params": {"max_new_tokens": 8}}


@dataclass
class Good:
    latencies: list[float] = field(default_factory=list)
    failures: Counter[str] = field(default_factory=Counter)

    def line(self, name: str, cpu_s: float) -> str:
        n = len(self.latencies)
        ms = [x * 1000 for x in self.latencies]
        cpu = 1000 * cpu_s / n if n else float("nan")
        return (
            f"{name:<8} {n:>6} ok  {sum(self.failures.values()):>4} failed {dict(self.failures)}  "
            f"p50 {percentile(ms, 50):7.1f} ms  p99 {percentile(ms, 99):7.1f} ms  "
            f"max {max(ms, default=0):7.1f} ms"
            f"  server CPU {cpu:.2f} ms/good request"
        )


async def good_client(base: str, key: str, job_id: str, duration: float, rate: float) -> Good:
    """An open loop: a request every 1/rate s whatever the answers' latency (no coordinated omission)."""
    import aiohttp

    result = Good()
    timeout = aiohttp.ClientTimeout(total=10)
    connector = aiohttp.TCPConnector(limit=8)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, headers=auth_headers(key)) as s:

        async def one(n: int) -> None:
            kind = n % 3
            started = time.perf_counter()
            try:
                if kind == 0:
                    req = s.get(f"{base}/v1/health")
                elif kind == 1:
                    req = s.get(f"{base}/v1/jobs/{job_id}")
                else:
                    req = s.post(f"{base}/v1/jobs", json=JOB)
                async with req as resp:
                    await resp.read()
                    if resp.status >= 400:
                        result.failures[str(resp.status)] += 1
                        return
            except (TimeoutError, aiohttp.ClientError) as exc:
                result.failures[type(exc).__name__] += 1
                return
            result.latencies.append(time.perf_counter() - started)

        tasks = []
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < duration:
            tasks.append(asyncio.create_task(one(n)))
            n += 1
            await asyncio.sleep(max(0.0, start + n / rate - time.perf_counter()))
        await asyncio.gather(*tasks)
    return result


async def hostile(port: int, kind: str, stop: asyncio.Event, seen: Counter[str]) -> None:
    """Hold one hostile connection until `stop`; reconnect whenever the server drops it."""
    while not stop.is_set():
        try:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            seen[f"{kind}: connect failed"] += 1
            await asyncio.sleep(0.5)
            continue
        seen[f"{kind}: connections"] += 1
        try:
            if kind == "slow-header":
                writer.write(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
            elif kind == "slow-body":
                writer.write(
                    b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                    b"Content-Length: 100000\r\n\r\n{"
                )
            await writer.drain()
            while not stop.is_set():
                # Wait a second for the server to speak or hang up, then trickle one more byte.
                with contextlib.suppress(TimeoutError):
                    data = await asyncio.wait_for(reader.read(4096), timeout=1.0)
                    if not data:
                        seen[f"{kind}: closed by server"] += 1
                        break
                    seen[f"{kind}: answered {data[9:12].decode(errors='replace')}"] += 1
                    break
                if kind == "slow-header":
                    writer.write(b"X")
                elif kind == "slow-body":
                    writer.write(b" ")
                await writer.drain()
        except (ConnectionError, OSError):
            seen[f"{kind}: reset"] += 1
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


async def attack(port: int, counts: dict[str, int], stop: asyncio.Event, seen: Counter[str]) -> None:
    conns = [hostile(port, kind, stop, seen) for kind, n in counts.items() for _ in range(n)]
    await asyncio.gather(*conns)


async def run(base: str, port: int, key: str, job_id: str, args: argparse.Namespace, procs) -> None:
    before = cpu_seconds(procs())
    alone = await good_client(base, key, job_id, args.baseline, args.rate)
    alone_cpu = cpu_seconds(procs()) - before

    stop = asyncio.Event()
    seen: Counter[str] = Counter()
    counts = {"idle": args.idle, "slow-header": args.slow_headers, "slow-body": args.slow_bodies}
    attackers = asyncio.create_task(attack(port, counts, stop, seen))
    await asyncio.sleep(args.ramp)  # let the hostile connections open before measuring
    before = cpu_seconds(procs())
    under = await good_client(base, key, job_id, args.duration, args.rate)
    under_cpu = cpu_seconds(procs()) - before
    stop.set()
    await attackers

    print(alone.line("alone", alone_cpu))
    print(under.line("attacked", under_cpu))
    print("attackers:", dict(sorted(seen.items())))
    ok = not under.failures and percentile([x * 1000 for x in under.latencies], 99) < args.goal_p99_ms
    print(f"verdict: {'ok' if ok else 'FAILED'} (goal: no failures, p99 < {args.goal_p99_ms:.0f} ms)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--slow-headers", type=int, default=100)
    ap.add_argument("--slow-bodies", type=int, default=100)
    ap.add_argument("--duration", type=float, default=60, help="seconds the attack is measured")
    ap.add_argument("--baseline", type=float, default=10, help="seconds of the good client alone")
    ap.add_argument("--ramp", type=float, default=3, help="seconds between opening the attack and measuring")
    ap.add_argument("--rate", type=float, default=20, help="good requests per second")
    ap.add_argument("--goal-p99-ms", type=float, default=200)
    ap.add_argument("--worker-class", default="", help="override ops/gunicorn.conf.py's (e.g. gthread)")
    args = ap.parse_args()
    print(machine())

    env = dict(NO_ADMISSION_LIMITS)
    if args.worker_class:
        env["GUNICORN_CMD_ARGS"] = f"--worker-class {args.worker_class} --threads 8"
    with temp_database() as db_url, temp_redis_db() as redis_url, tempfile.TemporaryDirectory() as art:
        key = bench_key(db_url)
        env |= {"DATABASE_URL": db_url, "BROKER_URL": redis_url, "GENQUEUE_ARTIFACT_DIR": art}
        with gunicorn("app:create_app()", env, probe="/v1/health") as (base, proc):
            import httpx

            job_id = httpx.post(f"{base}/v1/jobs", json=JOB, headers=auth_headers(key)).json()["id"]
            port = int(base.rsplit(":", 1)[1])
            print(f"gunicorn on {base}, worker class {args.worker_class or 'from ops/gunicorn.conf.py'}")
            asyncio.run(run(base, port, key, job_id, args, lambda: [*proc.children()]))


if __name__ == "__main__":
    main()
