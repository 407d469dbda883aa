"""Restart loop: N jobs through the Procfile's workers while the broker and the database restart.

Private servers only (the shared ones are never touched): a redis-server on a free port, with
--postgres-restarts a Postgres cluster of its own (pg_ctl), with --rabbitmq-restarts a RabbitMQ
node of its own (own node name, ports and data dir; tests/support/procs.py RabbitNode) as the
broker instead of Redis. Workers as the Procfile runs them (`genqueue worker`, gossip and
mingle on): text (threads, 8), video (prefork, 1), default (threads, 8). Jobs (video modality:
text -> video, echo models, the text ~0.03 s a word) arrive in rounds; after each round is under way,
one outage: stop, --down seconds, start. No beat: only the broker's own redelivery brings a
message back (--beat to run the reaper too; its recoveries are reported).

Reports per worker: alive at the end, Celery crashes (`Unrecoverable error`), restarts by
supervision; and jobs succeeded, duplicates (a second job.succeeded or job.started), reaper
recoveries. Exit status 0 only when every job succeeded exactly once and every worker is alive.

    PYTHONPATH=$PWD python bench/restarts.py --jobs 300 --redis-restarts 10
    PYTHONPATH=$PWD python bench/restarts.py --jobs 300 --redis-restarts 10 --postgres-restarts 3
    PYTHONPATH=$PWD python bench/restarts.py --jobs 300 --rabbitmq-restarts 3
    ... --no-guard (kombu patch off: the crash comes back)  --no-supervise (plain celery)
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from sqlalchemy import func, select  # noqa: E402

from bench.common import temp_database  # noqa: E402
from models import Job, JobEvent  # noqa: E402
from models.db import make_engine, make_session_factory, transaction  # noqa: E402
from models.keys import ensure_default_tenant  # noqa: E402
from models.migrate import upgrade  # noqa: E402
from models.settings import Settings  # noqa: E402
from tasks.celery_app import create_celery  # noqa: E402
from tests.support.jobs import submit  # noqa: E402
from tests.support.procs import PostgresServer, RabbitNode, RedisServer, Worker, wait_for, worker_env  # noqa: E402

TINY = {"width": 64, "height": 64, "num_frames": 1, "fps": 1, "steps": 1}
PROMPT = "one two three four five six seven eight"


@contextlib.contextmanager
def database(private: bool) -> Iterator[tuple[str, PostgresServer | None]]:
    if not private:
        with temp_database("gq_restarts") as url:
            yield url, None
        return
    server = PostgresServer().init().start()
    try:
        upgrade(server.url)
        yield server.url, server
    finally:
        with contextlib.suppress(subprocess.CalledProcessError):
            server.stop()
        server.remove()


def schedule(args: argparse.Namespace) -> list[str]:
    """The outages in order, the Postgres ones spread evenly among the broker ones."""
    broker = "rabbitmq" if args.rabbitmq_restarts else "redis"
    outages = [broker] * (args.rabbitmq_restarts or args.redis_restarts)
    for k in range(args.postgres_restarts):
        outages.insert((k + 1) * len(outages) // (args.postgres_restarts + 1) + k, "postgres")
    return outages


def counts(sessions: Any) -> dict[str, Any]:
    with sessions() as s:
        by_status = dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())

        def per_job(kind: str) -> dict[Any, int]:
            q = select(JobEvent.job_id, func.count()).where(JobEvent.type == kind).group_by(JobEvent.job_id)
            return dict(s.execute(q).all())

        succeeded, started = per_job("job.succeeded"), per_job("job.started")
        return {
            "status": by_status,
            "succeeded_events": len(succeeded),
            "duplicate_succeeded": sum(1 for n in succeeded.values() if n > 1),
            "duplicate_started": sum(1 for n in started.values() if n > 1),
            "recoveries": int(s.scalar(select(func.sum(Job.recoveries))) or 0),
            "redelivered_attempts": int(s.scalar(select(func.sum(Job.attempts))) or 0) - len(started),
        }


def succeeded(sessions: Any) -> int:
    try:
        with sessions() as s:
            return s.scalar(select(func.count()).select_from(Job).where(Job.status == "succeeded")) or 0
    except Exception:  # the database may be restarting
        return 0


def run(args: argparse.Namespace) -> dict[str, Any]:
    tmp = Path(tempfile.mkdtemp(prefix="gq-restarts-"))
    outages = schedule(args)
    with contextlib.ExitStack() as stack:
        if args.rabbitmq_restarts:
            broker: Any = RabbitNode(tmp / "rabbit").start()
        else:
            broker = RedisServer(tmp / "redis").start()
        stack.callback(broker.stop)
        db_url, pg = stack.enter_context(database(private=args.postgres_restarts > 0))
        s = Settings(
            database_url=db_url,
            broker_url=broker.url,
            artifact_dir=tmp / "artifacts",
            text_model="tests.support.generators:SlowText",
            video_model="echo",
            broker_visibility_timeout_s=20,  # a message whose ack the outage ate: back in 20 s
            broker_restore_interval_s=1,
            progress_interval_s=0.5,
            retry_backoff_s=0.05,
            retry_backoff_max_s=0.2,
        )
        engine = make_engine(db_url, pool_size=2)
        stack.callback(engine.dispose)
        sessions = make_session_factory(engine)
        with transaction(sessions) as db:
            ensure_default_tenant(db)
        extra = {
            "GENQUEUE_TEST_TOKEN_SECONDS": str(args.token_s),
            "GENQUEUE_INFRA_BACKOFF_S": "0.5",
            "GENQUEUE_INFRA_BACKOFF_MAX_S": "4",
            "GENQUEUE_WORKER_RESTART_BACKOFF_S": "1",
            "GENQUEUE_BROKER_CLOSED_TRANSPORT_GUARD": "false" if args.no_guard else "true",
        }
        env = worker_env(s, **extra)
        sup = not args.no_supervise
        workers = [
            Worker(env, "text", tmp, "text", "threads", 8, gossip=True, supervised=sup),
            Worker(env, "video", tmp, "video", "prefork", 1, gossip=True, supervised=sup),
            Worker(env, "default,webhooks", tmp, "default", "threads", 8, gossip=True, supervised=sup),
        ]
        for w in workers:
            w.start(timeout=180)
            stack.callback(w.stop)
        if args.beat:
            log = stack.enter_context(open(tmp / "beat.log", "ab"))
            cmd = [sys.executable, "-m", "celery", "-A", "tasks.worker", "beat", "-l", "INFO",
                   "--schedule", str(tmp / "beat-schedule")]  # fmt: skip
            beat = subprocess.Popen(cmd, cwd=ROOT, env=worker_env(s, GENQUEUE_REAPER_INTERVAL_S="5", **extra),
                                    stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
            stack.callback(beat.terminate)
        app = create_celery(s, set_as_current=False)
        started_at = time.monotonic()
        rounds = len(outages) or 1
        per_round = [args.jobs // rounds + (1 if k < args.jobs % rounds else 0) for k in range(rounds)]
        submitted, stalled = 0, 0
        for k, outage in enumerate(outages or [None]):
            for _ in range(per_round[k]):
                submit(sessions, app, "video", f"{PROMPT} {submitted}", **TINY)
                submitted += 1
            if outage is None:
                break
            # Under way: part of this round done, the rest running or queued, some threads idle.
            target = submitted - per_round[k] // 3
            try:
                wait_for(lambda t=target: succeeded(sessions) >= t, args.settle, 0.2, f"round {k + 1}")
            except AssertionError as exc:  # a worker is down for good: stop and report
                print(exc, flush=True)
                stalled = k + 1
                break
            server = pg if outage == "postgres" else broker
            server.stop()
            time.sleep(args.down)  # the outage itself
            server.start()
            down = [w.name for w in workers if not w.alive()]
            print(f"outage {k + 1}/{len(outages)} ({outage}): {succeeded(sessions)}/{submitted} succeeded"
                  + (f"; down: {down}" if down else ""), flush=True)  # fmt: skip
        for what, check in (
            ("every job to succeed", lambda: succeeded(sessions) >= args.jobs),
            # Alive, or back once supervision's backoff (up to 30 s) and a start have passed.
            ("every worker to be up", lambda: all(w.alive() for w in workers)),
        ):
            try:
                wait_for(check, args.settle, 0.5, what)
            except AssertionError as exc:
                print(exc, flush=True)
        result = {
            "jobs": args.jobs,
            "outages": {o: outages.count(o) for o in sorted(set(outages))},
            "down_s": args.down,
            "guard": not args.no_guard,
            "supervised": sup,
            "beat": args.beat,
            "wall_s": round(time.monotonic() - started_at, 1),
            "stalled_in_round": stalled,
            "workers": {
                w.name: {
                    "alive": w.alive(),
                    "celery_crashes": w.crashes(),
                    "supervisor_restarts": w.restarts(),
                }
                for w in workers
            },
            **counts(sessions),
            "logs": str(tmp),
        }
    return result


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", type=int, default=300)
    p.add_argument("--redis-restarts", type=int, default=10)
    p.add_argument("--postgres-restarts", type=int, default=0)
    p.add_argument("--rabbitmq-restarts", type=int, default=0, help="RabbitMQ as the broker instead of Redis")
    p.add_argument("--down", type=float, default=5.0, help="seconds each server stays down")
    p.add_argument("--settle", type=float, default=300.0, help="seconds to wait for the last jobs")
    p.add_argument("--token-s", type=float, default=0.03, help="SlowText seconds per word (8 words a job)")
    p.add_argument("--beat", action="store_true", help="run beat (the reaper) too")
    p.add_argument("--no-guard", action="store_true", help="turn the kombu patch off")
    p.add_argument("--no-supervise", action="store_true", help="plain `celery worker`, no restarts")
    args = p.parse_args()
    result = run(args)
    print(json.dumps(result, indent=2, default=str))
    ok = (
        result["succeeded_events"] == args.jobs
        and not result["stalled_in_round"]
        and result["duplicate_succeeded"] == 0
        and all(w["alive"] for w in result["workers"].values())
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
