"""Text-stage batching benchmark: 8 concurrent jobs through a real worker, batching on vs off.

    PYTHONPATH=$PWD python bench/batching.py [--model smollm2] [--jobs 8] [--tokens 48] [--rounds 2]

Three side-by-side figures, each a ratio against its baseline taken in the same run:
  raw      the adapter alone: N prompts as one padded generate() vs one by one (the ceiling);
  worker   N text jobs submitted at once to a Celery worker on Redis (`-P threads -c N`, the
           Procfile's text worker), GENQUEUE_TEXT_BATCH_MAX_SIZE=N vs =1 on the same config;
           measured from the first insert to the last job succeeded, best of --rounds.
Uses a throwaway Postgres database and a leased Redis db (the tests' lease keys), removed after.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import redis
from sqlalchemy import create_engine, text

ROOT = Path(__file__).resolve().parent.parent
PG_ADMIN = os.environ.get("GENQUEUE_TEST_PG", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres")
REDIS_HOST = os.environ.get("GENQUEUE_TEST_REDIS", "redis://127.0.0.1:6379")
PROMPTS = [
    "a red fox running through fresh snow at dawn",
    "a lighthouse in a storm, waves crashing",
    "a child flying a kite on a windy beach",
    "a steaming cup of coffee on a rainy window sill",
    "a cyclist racing down a mountain road",
    "an old train crossing a stone bridge in autumn",
    "a cat watching goldfish in a bowl",
    "fireworks over a city river at night",
]


@dataclass
class Env:
    """A private database, Redis db and artifact folder for one benchmark run."""

    database_url: str
    broker_url: str
    artifact_dir: Path

    def environ(self, **extra: str) -> dict[str, str]:
        env = dict(os.environ)
        env.update(
            DATABASE_URL=self.database_url,
            BROKER_URL=self.broker_url,
            GENQUEUE_ARTIFACT_DIR=str(self.artifact_dir),
            HF_HUB_OFFLINE="1",
            TRANSFORMERS_OFFLINE="1",
            PYTHONPATH=str(ROOT),
        )
        env.update(extra)
        return env


@contextlib.contextmanager
def bench_env() -> Iterator[Env]:
    from models.migrate import upgrade

    name = f"gq_bench_{os.getpid()}_{uuid.uuid4().hex[:6]}"
    db_url = PG_ADMIN.rsplit("/", 1)[0] + f"/{name}"
    lease = redis.Redis.from_url(f"{REDIS_HOST}/0")
    n = next(
        (i for i in range(1, 16) if lease.set(f"genqueue:test-db-lease:{i}", os.getpid(), nx=True, ex=3600)),
        0,
    )
    if not n:
        raise SystemExit("no free Redis db (all genqueue:test-db-lease:* keys taken)")
    broker_url = f"{REDIS_HOST}/{n}"
    redis.Redis.from_url(broker_url).flushdb()
    upgrade(db_url)
    with tempfile.TemporaryDirectory(prefix="gq-bench-") as tmp:
        try:
            yield Env(db_url, broker_url, Path(tmp))
        finally:
            redis.Redis.from_url(broker_url).flushdb()
            lease.delete(f"genqueue:test-db-lease:{n}")
            admin = create_engine(PG_ADMIN, isolation_level="AUTOCOMMIT")
            with admin.connect() as conn:
                conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            admin.dispose()


@contextlib.contextmanager
def worker(
    env: Env, queues: str, concurrency: int, log: Path, **extra: str
) -> Iterator[subprocess.Popen[bytes]]:
    """The Procfile's worker command (threads pool) as a subprocess; stopped with SIGTERM."""
    cmd = [
        sys.executable, "-m", "celery", "-A", "tasks.worker", "worker", "-Q", queues, "-P", "threads",
        "-c", str(concurrency), "-n", f"bench-{uuid.uuid4().hex[:6]}@%h", "-l", "WARNING",
        "--without-gossip", "--without-mingle", "--without-heartbeat",
    ]  # fmt: skip
    with open(log, "ab") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env.environ(**extra), stdout=out, stderr=subprocess.STDOUT)
    try:
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def submit_jobs(
    sessions, celery_app, prompts: list[str], params: dict, modality: str = "text"
) -> list[uuid.UUID]:
    """Insert all rows in one transaction, then publish each: N jobs arriving at once."""
    from models import Job
    from models.db import transaction
    from tasks.contract.publish import publish_job

    jobs = [Job(id=uuid.uuid4(), modality=modality, prompt=p, params=dict(params)) for p in prompts]
    with transaction(sessions) as s:
        s.add_all(jobs)
    for job in jobs:
        publish_job(celery_app, job.id, modality, "normal")
    return [j.id for j in jobs]


def wait_jobs(sessions, ids: list[uuid.UUID], timeout: float, proc: subprocess.Popen | None = None) -> list:
    from sqlalchemy import select

    from models import Job

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with sessions() as s:
            jobs = list(s.scalars(select(Job).where(Job.id.in_(ids))))
        if len(jobs) == len(ids) and all(j.status in ("succeeded", "failed", "canceled") for j in jobs):
            bad = [(j.prompt, j.error_code, j.error_message) for j in jobs if j.status != "succeeded"]
            if bad:
                raise SystemExit(f"jobs failed: {bad}")
            return jobs
        if proc is not None and proc.poll() is not None:
            raise SystemExit(f"worker exited with {proc.returncode}")
        time.sleep(0.02)
    raise SystemExit(f"jobs did not finish in {timeout}s")


def batches_seen(jobs: list) -> list[int]:
    """Batch sizes as the finishing times show them (a batch's jobs finish within ~50 ms)."""
    times = sorted(j.text_completed_at.timestamp() for j in jobs)
    sizes, last = [], None
    for t in times:
        if last is not None and t - last < 0.15:
            sizes[-1] += 1
        else:
            sizes.append(1)
        last = t
    return sizes


def raw_generate(model: str, n: int, tokens: int, rounds: int, dtype: str) -> tuple[float, float]:
    """Best-of-rounds seconds for n prompts one by one, and as one padded batch, in this process."""
    from tasks.generators.base import TextRequest
    from tasks.generators.registry import get_generator

    gen = get_generator("text", model, dtype)
    reqs = [TextRequest(p, max_new_tokens=tokens) for p in (PROMPTS * n)[:n]]
    gen.generate(reqs[:2])  # warm both paths once
    one_by_one = batched = float("inf")
    for _ in range(rounds):  # alternated, so a burst of load hits both sides alike
        started = time.perf_counter()
        for r in reqs:
            gen.generate([r])
        one_by_one = min(one_by_one, time.perf_counter() - started)
        started = time.perf_counter()
        gen.generate(reqs)
        batched = min(batched, time.perf_counter() - started)
    return one_by_one, batched


def worker_round(
    env: Env, model: str, n: int, tokens: int, batch: int, rounds: int, log: Path, dtype: str
) -> tuple[float, list]:
    """Best wall time over `rounds` for n text jobs submitted at once, and the batches seen."""
    from models.db import make_engine, make_session_factory
    from models.settings import Settings
    from tasks.celery_app import create_celery

    settings = Settings(
        database_url=env.database_url, broker_url=env.broker_url, artifact_dir=env.artifact_dir
    )
    engine = make_engine(env.database_url, pool_size=2)
    sessions = make_session_factory(engine)
    app = create_celery(settings, set_as_current=False)
    params = {"max_new_tokens": tokens, "temperature": 0.0, "seed": 1}
    extra = {
        "GENQUEUE_TEXT_MODEL": model,
        "GENQUEUE_WORKER_PRELOAD": "text",
        "GENQUEUE_TEXT_BATCH_MAX_SIZE": str(batch),
        "GENQUEUE_TEXT_DTYPE": dtype,
    }
    best, seen = float("inf"), []
    with worker(env, "text", n, log, **extra) as proc:
        wait_jobs(sessions, submit_jobs(sessions, app, ["warm up"], params), 600, proc)  # model loaded
        for _ in range(rounds):
            started = time.perf_counter()
            jobs = wait_jobs(sessions, submit_jobs(sessions, app, (PROMPTS * n)[:n], params), 900, proc)
            elapsed = time.perf_counter() - started
            if elapsed < best:
                best, seen = elapsed, batches_seen(jobs)
    engine.dispose()
    return best, seen


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2", help="text model (smollm2 = the real one; echo = wiring)")
    ap.add_argument("--jobs", type=int, default=8)
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--skip-raw", action="store_true")
    ap.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16"],
        help="GENQUEUE_TEXT_DTYPE for both sides (bfloat16 batches faster on AMX CPUs)",
    )
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    print(
        f"# batching: model={args.model} jobs={args.jobs} tokens={args.tokens} rounds={args.rounds} "
        f"dtype={args.dtype} cpus={os.cpu_count()} load={os.getloadavg()[0]:.2f}",
        flush=True,
    )
    if not args.skip_raw:
        one, batched = raw_generate(args.model, args.jobs, args.tokens, args.rounds, args.dtype)
        print(
            f"raw     {args.jobs} prompts one by one {one:8.2f} s   one padded batch {batched:8.2f} s   "
            f"speedup {one / batched:5.2f}x",
            flush=True,
        )
    with bench_env() as env:
        log = env.artifact_dir / "worker.log"
        try:
            common = (env, args.model, args.jobs, args.tokens)
            off, off_seen = worker_round(*common, 1, args.rounds, log, args.dtype)
            print(
                f"worker  batching off (max size 1) {off:8.2f} s  {args.jobs / off:6.2f} jobs/s  "
                f"batches {off_seen}",
                flush=True,
            )
            on, on_seen = worker_round(*common, args.jobs, args.rounds, log, args.dtype)
            print(
                f"worker  batching on  (max size {args.jobs}) {on:8.2f} s  {args.jobs / on:6.2f} jobs/s  "
                f"batches {on_seen}",
                flush=True,
            )
        except SystemExit:
            print(log.read_text()[-4000:], file=sys.stderr)
            raise
    print(
        f"worker  text-stage throughput, batching on / off: {off / on:5.2f}x  (goal: >= 4x at 8 jobs)",
        flush=True,
    )


if __name__ == "__main__":
    main()
