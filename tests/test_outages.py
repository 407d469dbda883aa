"""Outages of Redis and Postgres (private throwaway instances) during a run of 200 jobs.

The API answers 503 + Retry-After quickly while a dependency is down and recovers by
itself; workers reconnect by themselves; every job accepted before the outage ends
`succeeded` exactly once.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import func, select
from sqlalchemy.orm import Session, sessionmaker

from app import create_app
from models import Job, JobEvent
from models.db import make_engine, make_session_factory
from models.migrate import upgrade
from tests.support.api import authed_client_class, make_api_key
from tests.support.procs import ROOT, PostgresServer, RedisServer, Worker, pg_bin, wait_for, worker_env

pytestmark = pytest.mark.slow

N = 200
TINY = {"width": 64, "height": 64, "num_frames": 1, "fps": 1, "steps": 1}


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


@pytest.fixture
def own_postgres() -> Iterator[PostgresServer]:
    if pg_bin() is None:
        pytest.skip("no Postgres binaries (pg_ctl) on this machine")
    server = PostgresServer().init().start()
    try:
        upgrade(server.url)
        yield server
    finally:
        try:
            server.stop()
        except subprocess.CalledProcessError:
            pass  # already stopped
        server.remove()


@pytest.fixture
def stack(tmp_path) -> Iterator[Callable[..., Any]]:
    """Workers + beat (the Procfile's processes) for the given settings; stopped afterwards."""
    procs: list[Any] = []

    def start(settings) -> None:
        start.logs = tmp_path  # type: ignore[attr-defined]
        env = worker_env(
            settings,
            GENQUEUE_INFRA_BACKOFF_S="0.5",
            GENQUEUE_INFRA_BACKOFF_MAX_S="4",
            GENQUEUE_REAPER_INTERVAL_S="5",
            GENQUEUE_QUEUED_TIMEOUT_S="120",
        )
        procs.append(Worker(env, "text,default", tmp_path, "text", "threads", 2).start())
        procs.append(Worker(env, "video", tmp_path, "video", "prefork", 2).start())
        cmd = [sys.executable, "-m", "celery", "-A", "tasks.worker", "beat", "-l", "INFO",
               "--schedule", str(tmp_path / f"beat-{uuid.uuid4().hex[:6]}")]  # fmt: skip
        log = open(tmp_path / "beat.log", "ab")  # noqa: SIM115  closed with the process
        procs.append(subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT))

    yield start
    for p in procs:
        if isinstance(p, Worker):
            p.stop()
        else:
            p.terminate()
            p.wait(30)


def _counts(sessions: sessionmaker[Session]) -> dict[str, int]:
    try:
        with sessions() as s:
            return dict(s.execute(select(Job.status, func.count()).group_by(Job.status)).all())
    except Exception:
        return {}


def _quick_503(client, method: str, path: str, **kw: Any) -> None:
    started = time.monotonic()
    resp = client.open(path, method=method, **kw)
    elapsed = time.monotonic() - started
    assert resp.status_code == 503, resp.get_data(as_text=True)
    assert resp.mimetype == "application/problem+json" and int(resp.headers["Retry-After"]) > 0
    assert "Traceback" not in resp.get_data(as_text=True)
    assert elapsed < 15, f"{method} {path} took {elapsed:.1f}s to fail"


def _explain(sessions: sessionmaker[Session], logs: Any) -> None:
    """On a timeout: where the unfinished jobs are, and the end of every process log."""
    with sessions() as s:
        rows = s.execute(
            select(Job.status, Job.stage, Job.attempts, Job.recoveries, func.count())
            .where(Job.status != "succeeded")
            .group_by(Job.status, Job.stage, Job.attempts, Job.recoveries)
        ).all()
    print("unfinished (status, stage, attempts, recoveries, count):", rows)
    for log in sorted(logs.glob("*.log")):
        print(f"--- {log.name}\n" + "\n".join(log.read_text(errors="replace").splitlines()[-40:]))


def _run_through_outage(
    settings, stack, outage: Callable[[Any], int], max_recoveries: int | None = None
) -> None:
    """Submit N jobs, cause the outage mid-run; `outage` returns how many jobs it submitted itself.

    `max_recoveries`: how many reaper interventions the run may need. The reaper (beat, every
    5 s here) would republish a message the outage dropped well inside the wait, so "every job
    succeeded once" alone cannot see a lost message; each republish costs the job a recovery.
    """
    settings = settings.model_copy(update={"plan_rate_limit": "100000/second"})  # submit at full speed
    api = create_app(settings)
    engine = make_engine(settings.database_url, pool_size=2)
    sessions = make_session_factory(engine)
    api.test_client_class = authed_client_class(make_api_key(sessions))
    client = api.test_client()
    try:
        stack(settings)
        logs = stack.logs  # type: ignore[attr-defined]
        ids = []
        for i in range(N):
            resp = client.post("/v1/jobs", json={"prompt": f"job {i}", "modality": "video", "params": TINY})
            assert resp.status_code == 202, resp.get_json()
            ids.append(uuid.UUID(resp.get_json()["id"]))
        wait_for(lambda: _counts(sessions).get("succeeded", 0) >= 20, 180, 0.2, "the run to get going")
        assert _counts(sessions).get("succeeded", 0) < N, "the outage must hit a run in progress"
        total = N + outage(client)
        try:
            wait_for(lambda: _counts(sessions).get("succeeded", 0) == total, 420, 0.5, "every job to succeed")
        except AssertionError:
            _explain(sessions, logs)
            raise
        with sessions() as s:
            assert s.scalar(select(func.count()).select_from(Job)) == total  # nothing duplicated
            per_job = dict(
                s.execute(
                    select(JobEvent.job_id, func.count())
                    .where(JobEvent.type == "job.succeeded")
                    .group_by(JobEvent.job_id)
                ).all()
            )
            recoveries = s.scalar(select(func.sum(Job.recoveries))) or 0
        assert len(per_job) == total and set(per_job.values()) == {1}  # one completion each
        assert set(ids) <= set(per_job)
        print(f"reaper recoveries during the run: {recoveries}")
        if max_recoveries is not None:
            assert recoveries <= max_recoveries, f"{recoveries} jobs needed the reaper: a message was lost"
    finally:
        engine.dispose()
        api.extensions["genqueue"].engine.dispose()


def test_redis_restart_during_200_jobs(settings, sessions, own_redis, stack):
    # `sessions` empties the per-run database first: the counts below must see this run's jobs only.
    fast_restore = {"broker_visibility_timeout_s": 20, "broker_restore_interval_s": 1}
    s = settings.model_copy(update={"broker_url": own_redis.url, **fast_restore})

    def outage(client) -> int:
        own_redis.stop()
        _quick_503(client, "POST", "/v1/jobs", json={"prompt": "x", "modality": "text"})
        _quick_503(client, "GET", "/v1/ready")
        assert client.get("/v1/health").status_code == 200
        own_redis.start()  # same port, same append-only file
        wait_for(
            lambda: client.post("/v1/jobs", json={"prompt": "x", "modality": "text"}).status_code == 202
            or None,
            60, 0.5, "the API to publish again",
        )  # fmt: skip
        return 1

    _run_through_outage(s, stack, outage)


def test_postgres_restart_during_200_jobs(settings, own_redis, own_postgres, stack):
    s = settings.model_copy(update={"broker_url": own_redis.url, "database_url": own_postgres.url})

    def outage(client) -> int:
        own_postgres.stop()
        _quick_503(client, "POST", "/v1/jobs", json={"prompt": "x", "modality": "text"})
        _quick_503(client, "GET", f"/v1/jobs/{uuid.uuid4()}")
        _quick_503(client, "GET", "/v1/ready")
        own_postgres.start()
        wait_for(lambda: client.get("/v1/ready").status_code == 200, 60, 0.5, "the API to be ready again")
        return 0

    # A database outage drops no broker message: tasks that met it retry (infra backoff) or
    # are redelivered by the broker, none needs the reaper.
    _run_through_outage(s, stack, outage, max_recoveries=0)
