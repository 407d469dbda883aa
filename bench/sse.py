"""Event streams under gunicorn: submit and poll latency with N open SSE streams vs none, same run.

Jobs seeded as running get their progress moved (by this script, as workers would) so the
streams are live, not only heartbeating: each move is a NOTIFY that wakes the job's streams,
which read their new rows. The baseline is the same submit + poll load with no stream open.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import tempfile
import threading
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field

from bench.api import JOB
from bench.common import (
    NO_ADMISSION_LIMITS,
    Load,
    Process,
    Result,
    _load,
    auth_headers,
    bench_key,
    cpu_seconds,
    gunicorn,
    machine,
    print_results,
    temp_database,
    temp_redis_db,
)


def _seed_running(db_url: str, count: int) -> list[uuid.UUID]:
    """`count` jobs running their video stage at progress 20 (the stream targets)."""
    from sqlalchemy import create_engine, insert

    from models import Job

    engine = create_engine(db_url)
    ids = [uuid.uuid4() for _ in range(count)]
    rows = [
        {"id": i, "status": "running", "stage": "video", "progress": 20, "modality": "video",
         "prompt": JOB["prompt"], "params": JOB["params"]}
        for i in ids
    ]  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(Job), rows)
    engine.dispose()
    return ids


class Mover(threading.Thread):
    """Moves the seeded jobs' progress, `rate` moves per second in all, as workers would."""

    def __init__(self, db_url: str, ids: list[uuid.UUID], rate: float) -> None:
        super().__init__(daemon=True)
        self.db_url, self.ids, self.rate = db_url, ids, rate
        self.stop, self.moves = threading.Event(), 0

    def run(self) -> None:
        from models import Stage, states
        from models.db import make_engine, make_session_factory, transaction

        engine = make_engine(self.db_url, pool_size=1)
        sessions = make_session_factory(engine)
        progress = dict.fromkeys(self.ids, 20)
        n = 0
        while not self.stop.wait(1 / self.rate):
            jid = self.ids[n % len(self.ids)]
            n += 1
            progress[jid] = min(progress[jid] + 1, 94)
            with transaction(sessions) as s:
                self.moves += states.set_progress(s, jid, Stage.VIDEO, progress[jid])
        engine.dispose()


@dataclass
class Streams:
    opened: int = 0
    frames: int = 0
    heartbeats: int = 0
    failed: int = 0
    refused: dict[int, int] = field(default_factory=dict)  # status -> count of streams not opened


async def _stream(url: str, headers: dict[str, str], until: float, seen: Streams, delay: float) -> None:
    import aiohttp

    await asyncio.sleep(delay)  # a ramp: clients connect over a second or two, not all at once
    timeout = aiohttp.ClientTimeout(total=None, sock_read=60)
    async with aiohttp.ClientSession(headers=headers, timeout=timeout) as session:
        try:
            async with session.get(url, headers={"Accept": "text/event-stream"}) as resp:
                if resp.status != 200:
                    seen.failed += 1
                    seen.refused[resp.status] = seen.refused.get(resp.status, 0) + 1
                    return
                seen.opened += 1
                while time.monotonic() < until:
                    try:
                        line = await asyncio.wait_for(resp.content.readline(), until - time.monotonic())
                    except TimeoutError:
                        return
                    if not line:
                        seen.failed += 1  # the server closed a stream that had not ended
                        return
                    if line.startswith(b"event:"):
                        seen.frames += 1
                    elif line.startswith(b":"):
                        seen.heartbeats += 1
        except aiohttp.ClientError:
            seen.failed += 1


async def _round(
    base: str, headers: dict[str, str], ids: list[str], stream_ids: list[uuid.UUID], args: argparse.Namespace
) -> tuple[Load, Load, Streams]:
    rng = random.Random(1)
    seen = Streams()
    until = time.monotonic() + args.duration + 30  # streams stay open past the load
    tasks = [
        asyncio.create_task(
            _stream(f"{base}/v1/jobs/{stream_ids[n % len(stream_ids)]}/events", headers, until, seen, n / 250)
        )
        for n in range(args.streams if stream_ids else 0)
    ]
    if tasks:
        deadline = time.monotonic() + 60
        while seen.opened + seen.failed < len(tasks) and time.monotonic() < deadline:
            await asyncio.sleep(0.2)
        print(f"  {seen.opened} streams open ({seen.failed} failed: {seen.refused})", flush=True)

    def submit(_n: int) -> tuple[str, str, object]:
        return "POST", base + "/v1/jobs", JOB

    def poll(_n: int) -> tuple[str, str, object]:
        return "GET", f"{base}/v1/jobs/{rng.choice(ids)}", None

    ok = {200, 202}
    submits, polls = await asyncio.gather(
        _load(submit, args.concurrency, args.duration, None, ok, headers),
        _load(poll, args.concurrency, args.duration, None, ok, headers),
    )
    for t in tasks:
        t.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    return submits, polls, seen


def _measure(
    name: str, srv: Process, base: str, headers: dict[str, str], ids: list[str],
    stream_ids: list[uuid.UUID], args: argparse.Namespace,
) -> tuple[Load, Load, Streams, float]:  # fmt: skip
    workers = srv.children()
    cpu = cpu_seconds(workers)
    submits, polls, seen = asyncio.run(_round(base, headers, ids, stream_ids, args))
    used = cpu_seconds(workers) - cpu
    per_op = 1000 * used / max(1, len(submits.latencies) + len(polls.latencies))
    print(f"  {name}: submit {submits.summary()}", flush=True)
    print(f"  {name}: poll {polls.summary()}", flush=True)
    print(
        f"  {name}: streams {seen.opened} open, {seen.frames} events, {seen.heartbeats} heartbeats, "
        f"{seen.failed} failed; web CPU {per_op:.2f} ms per submit or poll (streams' work included)",
        flush=True,
    )
    return submits, polls, seen, per_op


def run(args: argparse.Namespace) -> list[Result]:
    print(
        f"sse: {args.streams} streams on {args.jobs} running jobs ({args.moves:g} progress moves/s), "
        f"{args.concurrency} submit + {args.concurrency} poll connections, {args.duration:g} s; {machine()}"
    )
    env = NO_ADMISSION_LIMITS | {
        "GENQUEUE_STREAM_MAX_PER_TENANT": str(args.streams * 2),
        "GENQUEUE_STREAM_MAX_PER_PROCESS": str(args.streams * 2),
    }
    if args.workers:
        env["WEB_CONCURRENCY"] = str(args.workers)
    with (
        temp_database() as db_url,
        temp_redis_db() as redis_url,
        tempfile.TemporaryDirectory(prefix="gq-bench-") as artifacts,
    ):
        env |= {"DATABASE_URL": db_url, "BROKER_URL": redis_url, "GENQUEUE_ARTIFACT_DIR": artifacts}
        headers = auth_headers(bench_key(db_url))
        stream_ids = _seed_running(db_url, args.jobs)
        ids = [str(i) for i in stream_ids]
        with gunicorn("app:create_app()", env, probe="/v1/health") as (base, proc):
            mover = Mover(db_url, stream_ids, args.moves)
            mover.start()
            try:
                if args.warmup > 0:  # pools, caches and the gevent hub warm, then the two runs
                    warm = argparse.Namespace(**{**vars(args), "duration": args.warmup})
                    asyncio.run(_round(base, headers, ids, [], warm))
                print("without streams")
                b_sub, b_poll, _, b_cpu = _measure("no streams", proc, base, headers, ids, [], args)
                print(f"with {args.streams} streams")
                s_sub, s_poll, seen, s_cpu = _measure("streams", proc, base, headers, ids, stream_ids, args)
            finally:
                mover.stop.set()
                mover.join(10)
    results = [
        Result("sse", "submit p99", s_sub.p(99), b_sub.p(99), "ms", "< 1000 ms", False),
        Result("sse", "submit throughput", s_sub.rate, b_sub.rate, "req/s"),
        Result("sse", "poll p99", s_poll.p(99), b_poll.p(99), "ms", higher_is_better=False),
        Result("sse", "web CPU per operation", s_cpu, b_cpu, "ms", higher_is_better=False),
        Result("sse", "streams open", seen.opened, args.streams, "streams"),
    ]
    print_results(results)
    return results


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--streams", type=int, default=500)
    parser.add_argument("--jobs", type=int, default=100, help="running jobs the streams follow")
    parser.add_argument("--moves", type=float, default=50.0, help="progress moves per second, all jobs")
    parser.add_argument("--duration", type=float, default=20.0, help="seconds per measurement")
    parser.add_argument("--warmup", type=float, default=3.0, help="seconds of load before the runs")
    parser.add_argument("--concurrency", type=int, default=16, help="submit (and poll) connections")
    parser.add_argument("--workers", type=int, help="gunicorn workers (default: the config's)")


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
