"""A storyboard's shots in parallel: one film end to end on 1 vs 2 video workers, fixed-cost shots.

Each shot renders on the echo video model sleeping GENQUEUE_ECHO_STEP_SECONDS per step, so a
shot costs `steps * step_s` whatever the machine's load (the CPU's part, the MP4 encode of a few
tiny frames, is small beside it). The film's time is from its publish to `succeeded`: the text
stage, the fan-out, the shots, the stitch. The issue's target: 2 workers at least 1.7x faster.

    python -m bench.storyboard --shots 4 --step-s 0.25 --steps 4 --runs 3
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator

from bench.common import machine, python_env, spawn, temp_database, temp_redis_db, wait_until

TERMINAL = ("succeeded", "failed", "canceled")


def _worker(queues: str, pool: str, concurrency: int) -> list[str]:
    name = f"bench-{uuid.uuid4().hex[:6]}@%h"
    return [sys.executable, "-m", "celery", "-A", "tasks.worker", "worker", "-Q", queues, "-P", pool,
            "-c", str(concurrency), "-n", name, "-l", "WARNING"]  # fmt: skip


@contextlib.contextmanager
def _stack(db_url: str, redis_url: str, video_workers: int, step_s: float) -> Iterator[None]:
    """A text + default worker and `video_workers` video workers (prefork, one process each)."""
    with tempfile.TemporaryDirectory(prefix="gq-bench-") as artifacts, contextlib.ExitStack() as stack:
        env = python_env(
            DATABASE_URL=db_url, BROKER_URL=redis_url, GENQUEUE_TEXT_MODEL="echo",
            GENQUEUE_VIDEO_MODEL="echo", GENQUEUE_ARTIFACT_DIR=artifacts,
            GENQUEUE_ECHO_STEP_SECONDS=str(step_s),
        )  # fmt: skip
        stack.enter_context(spawn(_worker("text,default", "threads", 4), env, "celery-text"))
        for k in range(video_workers):
            stack.enter_context(spawn(_worker("video", "prefork", 1), env, f"celery-video-{k}"))
        yield


def _film(db_url: str, redis_url: str, params: dict[str, object], timeout: float) -> float:
    """Seconds from publishing one storyboard to its success."""
    from sqlalchemy import insert, select

    from models import Job
    from models.db import make_engine
    from models.settings import Settings
    from tasks.celery_app import create_celery
    from tasks.contract.publish import publish_job

    app = create_celery(Settings(database_url=db_url, broker_url=redis_url), set_as_current=False)
    engine = make_engine(db_url, pool_size=1)
    jid = uuid.uuid4()
    prompt = "a lighthouse. a ship. a storm. dawn."
    row = {"id": jid, "status": "queued", "modality": "storyboard", "prompt": prompt,
           "params": params | {"seed": jid.int % 1000}}  # fmt: skip
    with engine.begin() as conn:
        conn.execute(insert(Job), [row])
    started = time.perf_counter()
    publish_job(app, jid, "storyboard", "normal")

    def status() -> str:
        with engine.connect() as conn:
            return str(conn.execute(select(Job.status).where(Job.id == jid)).scalar_one())

    wait_until(lambda: status() in TERMINAL, timeout, "the storyboard", interval=0.02)
    seconds = time.perf_counter() - started
    final = status()
    engine.dispose()
    if final != "succeeded":
        raise RuntimeError(f"storyboard {jid} {final}")
    return seconds


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shots", type=int, default=4)
    ap.add_argument("--steps", type=int, default=4, help="denoising steps per shot (each sleeps --step-s)")
    ap.add_argument("--step-s", type=float, default=0.25)
    ap.add_argument("--runs", type=int, default=3, help="films per configuration (the median is reported)")
    args = ap.parse_args(argv)
    params = {"shots": args.shots, "width": 64, "height": 64, "num_frames": 9, "fps": 8, "steps": args.steps,
              "enhance_prompt": False, "max_new_tokens": 16, "temperature": 0.0}  # fmt: skip
    results: dict[int, list[float]] = {}
    for workers in (1, 2):
        with (
            temp_database() as db_url,
            temp_redis_db() as redis_url,
            _stack(db_url, redis_url, workers, args.step_s),
        ):
            _film(db_url, redis_url, params, 120)  # warm-up: the workers' start, model load
            results[workers] = [_film(db_url, redis_url, params, 120) for _ in range(args.runs)]
    one, two = statistics.median(results[1]), statistics.median(results[2])
    shot_s = args.steps * args.step_s
    print(f"# {machine()}")
    cost = f"echo video, {args.steps} steps x {args.step_s} s"
    print(f"# {args.shots} shots of {shot_s:.2f} s fixed cost ({cost})")
    print("| video workers | film seconds (median of runs) | runs |")
    print("|---|---|---|")
    for workers, runs in results.items():
        print(f"| {workers} | {statistics.median(runs):.2f} | {', '.join(f'{r:.2f}' for r in runs)} |")
    print(f"speedup 2 vs 1 workers: {one / two:.2f}x (target >= 1.7x)")
    summary = {"bench": "storyboard", "shots": args.shots, "shot_s": shot_s, "one_worker_s": round(one, 3),
               "two_workers_s": round(two, 3), "speedup": round(one / two, 3)}  # fmt: skip
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
