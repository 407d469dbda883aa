"""Generator busy fraction: the share of a saturated worker's wall time spent inside generate() (issue 12).

One worker of a stage runs bench.fixed_generators (GENQUEUE_BENCH_GENERATE_MS per call, 200 ms by
default) against a queue filled before it starts, so it is saturated from its first task to its
last; each call's start and end come back through GENQUEUE_BENCH_INTERVALS. Busy fraction = time
inside generate (the union of the calls) / wall time of the window: the middle of the run (from
the start of the call 10% of the way in to the end of the call 90% of the way in, so neither the
worker's first fetch nor the last, partial batch counts), and beside it the whole span from the
first call's start to the last call's end.

Jobs are committed and published as the API does (tests.support.jobs.submit), all before the
measured worker starts: a submitting API would compete with the worker for this machine's two
cores. Video jobs pass their text stage first on an `echo` text worker; the video worker starts
once all of them wait for it. For a one-task-at-a-time worker the gap between two calls is split
by timestamps (task start/end, encode) into: finish (generate end -> task end: encode, upload,
the completing UPDATE), handoff (task end -> next task start: ack, result, the next message), and
enter (task start -> generate start: the stage's entry UPDATE, building the request).
"""

from __future__ import annotations

import argparse
import contextlib
import itertools
import json
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from bench.common import machine, temp_database, temp_redis_db, wait_until
from bench.fixed_generators import INTERVALS_ENV, MS_ENV, TARGETS

Interval = tuple[float, float]
TERMINAL = ("succeeded", "failed", "canceled")
DEFAULT_RUNS = (
    ("text", "threads", 8),
    ("text", "threads", 16),
    ("video", "prefork", 1),
    ("video", "threads", 2),
)
DEFAULT_JOBS = {"text": 320, "video": 40}
# The API's defaults for a video job (models/settings/serving.py): what the stage encodes per job.
VIDEO_PARAMS = {"width": 256, "height": 256, "num_frames": 17, "fps": 8, "steps": 8}


# --- arithmetic ----------------------------------------------------------------------------------


def union_seconds(intervals: Sequence[Interval], lo: float, hi: float) -> float:
    """Seconds of [lo, hi] covered by at least one interval (overlapping calls count once)."""
    total, reach = 0.0, lo
    for start, end in sorted(intervals):
        start, end = max(start, reach), min(end, hi)
        if end > start:
            total += end - start
            reach = end
    return total


def middle_window(intervals: Sequence[Interval], trim: float = 0.1) -> Interval:
    """From the start of the call `trim` of the way in to the end of the call `trim` from the end."""
    ordered = sorted(intervals)
    k = int(len(ordered) * trim)
    inner = ordered[k : len(ordered) - k] or ordered
    return inner[0][0], max(end for _, end in inner)


def busy_fraction(intervals: Sequence[Interval], window: Interval) -> float:
    lo, hi = window
    return union_seconds(intervals, lo, hi) / (hi - lo) if hi > lo else float("nan")


def span(intervals: Sequence[Interval]) -> Interval:
    return min(s for s, _ in intervals), max(e for _, e in intervals)


def read_records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def mean_gap_ms(intervals: Sequence[Interval]) -> float:
    """Mean milliseconds from one call's end to the next call's start (calls of one collector)."""
    ordered = sorted(intervals)
    between = [b[0] - a[1] for a, b in itertools.pairwise(ordered)]
    return round(1000 * sum(between) / len(between), 1) if between else float("nan")


def gaps(records: Sequence[dict[str, Any]], stage: str) -> dict[str, float]:
    """Mean milliseconds of each part of the gap between two generate calls of a one-task worker."""
    calls = sorted(
        (r for r in records if r["kind"] == "generate" and r["stage"] == stage), key=lambda r: r["start"]
    )
    tasks = sorted(
        (r for r in records if r["kind"] == "task" and stage in r["name"]), key=lambda r: r["start"]
    )
    encodes = [r for r in records if r["kind"] == "encode"]
    parts: dict[str, list[float]] = {"gap": [], "finish": [], "encode": [], "handoff": [], "enter": []}
    for prev, nxt in itertools.pairwise(calls):
        mine = [t for t in tasks if t["start"] <= prev["start"] and t["end"] >= prev["end"]]
        after = [t for t in tasks if prev["end"] <= t["start"] <= nxt["start"]]
        if not mine or not after:
            continue
        task, following = mine[-1], after[-1]
        parts["gap"].append(nxt["start"] - prev["end"])
        parts["finish"].append(task["end"] - prev["end"])
        parts["encode"].append(
            sum(e["end"] - e["start"] for e in encodes if prev["end"] <= e["start"] <= task["end"])
        )
        parts["handoff"].append(following["start"] - task["end"])
        parts["enter"].append(nxt["start"] - following["start"])
    return {k: round(1000 * sum(v) / len(v), 1) for k, v in parts.items() if v}


# --- one run -------------------------------------------------------------------------------------


@dataclass
class Run:
    stage: str
    pool: str
    concurrency: int
    jobs: int
    calls: int = 0
    mean_batch: float = 0.0
    window_s: float = 0.0
    busy: float = 0.0  # middle window
    busy_span: float = 0.0  # first call's start to last call's end
    jobs_per_s: float = 0.0
    failed: int = 0
    gap_ms: dict[str, float] = field(default_factory=dict)
    env: dict[str, str] = field(default_factory=dict)  # --env settings of the measured worker


@contextlib.contextmanager
def _worker(env: dict[str, str], queue: str, pool: str, concurrency: int, tmp: Path) -> Iterator[Any]:
    """A worker as the Procfile runs it (`genqueue worker`, gossip and mingle on)."""
    from tests.support.procs import Worker

    w = Worker(env, queue, tmp, queue, pool, concurrency, gossip=True, supervised=True, quiet=True)
    try:
        yield w.start(timeout=120)
    finally:
        w.stop()


def _count(sessions: Any, *where: Any) -> int:
    from sqlalchemy import func, select

    from models import Job

    with sessions() as s:
        return int(s.scalar(select(func.count()).select_from(Job).where(*where)) or 0)


def measure(
    stage: str, pool: str, concurrency: int, jobs: int, ms: float, db_url: str, redis_url: str,
    extra: dict[str, str] | None = None,
) -> Run:  # fmt: skip
    from models import Job
    from models.db import make_engine, make_session_factory, transaction
    from models.keys import ensure_default_tenant
    from models.settings import Settings
    from tasks.celery_app import create_celery
    from tests.support.jobs import submit
    from tests.support.procs import worker_env

    tmp = Path(tempfile.mkdtemp(prefix="gq-busy-"))
    intervals = tmp / "intervals.jsonl"
    s = Settings(database_url=db_url, broker_url=redis_url, artifact_dir=tmp / "artifacts",
                 text_model=TARGETS["text"], video_model=TARGETS["video"])  # fmt: skip
    env = worker_env(s, **{MS_ENV: str(ms), INTERVALS_ENV: str(intervals), "GENQUEUE_WORKER_PRELOAD": stage})
    env |= extra or {}
    engine = make_engine(db_url, pool_size=2)
    sessions = make_session_factory(engine)
    app = create_celery(s, set_as_current=False)
    with transaction(sessions) as db:
        ensure_default_tenant(db)
    # Runs share the database; the earlier runs' jobs have all finished.
    before, failed_before = _count(sessions), _count(sessions, Job.status.in_(("failed", "canceled")))
    try:
        with contextlib.ExitStack() as stack:
            params = VIDEO_PARAMS if stage == "video" else {"max_new_tokens": 16}
            for k in range(jobs):
                submit(sessions, app, stage, f"a fox, take {k}", seed=k, **params)
            if stage == "video":  # the text stage first, on a zero-cost worker, so video's queue is full
                text_env = env | {"GENQUEUE_TEXT_MODEL": "echo", "GENQUEUE_WORKER_PRELOAD": "text"}
                stack.enter_context(_worker(text_env, "text", "threads", 8, tmp))
                wait_until(lambda: _count(sessions, Job.stage == "video") >= jobs, 120, "text stages")
            worker = stack.enter_context(_worker(env, stage, pool, concurrency, tmp))

            def done() -> bool:
                if not worker.alive():
                    raise RuntimeError(f"worker exited:\n{worker.log_text()[-3000:]}")
                return _count(sessions, Job.status.in_(TERMINAL)) >= before + jobs

            wait_until(done, 60 + jobs * ms / 1000 * 3, f"{jobs} {stage} jobs", interval=0.2)
        failed = _count(sessions, Job.status.in_(("failed", "canceled"))) - failed_before
    finally:
        engine.dispose()
    records = read_records(intervals)
    shutil.rmtree(tmp, ignore_errors=True)  # kept when the run failed: the workers' logs are there
    calls = [r for r in records if r["kind"] == "generate" and r["stage"] == stage]
    pairs = [(float(r["start"]), float(r["end"])) for r in calls]
    window = middle_window(pairs)
    run = Run(stage, pool, concurrency, jobs, calls=len(calls), failed=failed, env=extra or {})
    run.mean_batch = round(sum(r["n"] for r in calls) / len(calls), 2)
    run.window_s = round(window[1] - window[0], 2)
    run.busy = round(busy_fraction(pairs, window), 4)
    run.busy_span = round(busy_fraction(pairs, span(pairs)), 4)
    lo, hi = span(pairs)
    run.jobs_per_s = round(jobs / (hi - lo), 2)
    # Split by task times only where one task runs at a time; else just the mean gap.
    run.gap_ms = gaps(records, stage) if concurrency == 1 else {"gap": mean_gap_ms(pairs)}
    return run


# --- command line --------------------------------------------------------------------------------


def table(runs: Sequence[Run], ms: float) -> str:
    head = f"{'stage':<6} {'pool':<8} {'-c':>3} {'jobs':>5} {'calls':>5} {'batch':>6} {'window s':>8} "
    head += f"{'busy':>7} {'busy(span)':>10} {'jobs/s':>7}  gap between calls (ms, mean)"
    lines = [f"generate = {ms:.0f} ms per call", head]
    for r in runs:
        gap = ", ".join(f"{k} {v}" for k, v in r.gap_ms.items()) + "".join(
            f" [{k}={v}]" for k, v in r.env.items()
        )
        lines.append(
            f"{r.stage:<6} {r.pool:<8} {r.concurrency:>3} {r.jobs:>5} {r.calls:>5} {r.mean_batch:>6.2f} "
            f"{r.window_s:>8.2f} {100 * r.busy:>6.1f}% {100 * r.busy_span:>9.1f}% {r.jobs_per_s:>7.2f}  {gap}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> list[Run]:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--stage",
        choices=("text", "video"),
        help="one stage (with --pool/--concurrency); default: the four runs",
    )
    p.add_argument("--pool", choices=("threads", "prefork"), help="with --stage")
    p.add_argument("--concurrency", "-c", type=int, help="with --stage")
    p.add_argument("--jobs", type=int, help=f"jobs per run (default {DEFAULT_JOBS})")
    p.add_argument(
        "--env",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a setting for the measured worker, e.g. GENQUEUE_VIDEO_BATCH_MAX_SIZE=1 (repeatable)",
    )
    p.add_argument("--generate-ms", type=float, default=200.0, help="the fixed generators' time per call")
    args = p.parse_args(argv)
    if args.stage:
        plan = [(args.stage, args.pool or "threads", args.concurrency or (16 if args.stage == "text" else 2))]
    else:
        plan = list(DEFAULT_RUNS)
    extra = dict(item.split("=", 1) for item in args.env)
    print(f"busy: {machine()}", flush=True)
    runs = []
    with temp_database("gq_busy") as db_url, temp_redis_db() as redis_url:
        for stage, pool, c in plan:
            started = time.monotonic()
            jobs = args.jobs or DEFAULT_JOBS[stage]
            run = measure(stage, pool, c, jobs, args.generate_ms, db_url, redis_url, extra)
            print(
                f"  {stage} {pool} -c {c}: busy {100 * run.busy:.1f}% ({time.monotonic() - started:.0f} s)",
                flush=True,
            )
            runs.append(run)
    print(table(runs, args.generate_ms))
    print(json.dumps({"bench": "busy", "generate_ms": args.generate_ms, "runs": [asdict(r) for r in runs]}))
    if any(r.failed for r in runs):
        sys.exit(1)
    return runs


if __name__ == "__main__":
    main()
