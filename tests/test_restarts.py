"""Workers survive a loop of Redis restarts (issue 13, finding 2): none exits, every job runs once.

The Procfile's workers as subprocesses (`genqueue worker`, gossip and mingle on, the text worker
on 8 threads) on a private Redis, restarted while jobs run. Jobs arrive a few at a time so the
text worker has idle threads and sits in BRPOP when the connection drops: the state in which
kombu 5.7 crashed the worker with `AttributeError: 'NoneType' object has no attribute
'hostname'` (tasks/kombu_fixes.py). No beat runs: nothing but the broker's own redelivery can
bring a message back, so a lost one fails the test instead of being rescued by the reaper.
"""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest
from sqlalchemy import func, select

from models import Job, JobEvent
from tasks.celery_app import create_celery
from tests.support.jobs import submit
from tests.support.procs import RedisServer, Worker, wait_for, worker_env

pytestmark = pytest.mark.slow

RESTARTS = 6
JOBS_PER_ROUND = 5
DOWN_S = 4  # the report's outage was 5 s
TINY = {"width": 64, "height": 64, "num_frames": 1, "fps": 1, "steps": 1}


@pytest.fixture
def own_redis(tmp_path) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path / "redis").start()
    yield server
    server.stop()


def _event_counts(sessions, type_: str) -> dict:
    with sessions() as s:
        q = select(JobEvent.job_id, func.count()).where(JobEvent.type == type_).group_by(JobEvent.job_id)
        return dict(s.execute(q).all())


def _any_started(sessions, batch: list) -> bool:
    return bool(set(batch) & set(_event_counts(sessions, "job.started")))


def _succeeded(sessions) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(Job).where(Job.status == "succeeded")) or 0


def test_workers_survive_redis_restarts_and_every_job_runs_once(settings, sessions, own_redis, tmp_path):
    s = settings.model_copy(
        update={
            "broker_url": own_redis.url,
            # A message whose ack the outage ate comes back in 20 s, not 2 h.
            "broker_visibility_timeout_s": 20,
            "broker_restore_interval_s": 1,
            "text_model": "tests.support.generators:SlowText",
        }
    )
    env = worker_env(s, GENQUEUE_TEST_TOKEN_SECONDS="0.1", GENQUEUE_WORKER_RESTART_BACKOFF_S="0.5")
    workers = [
        Worker(env, "text", tmp_path, "text", "threads", 8, gossip=True, supervised=True).start(),
        Worker(env, "video,default", tmp_path, "video", "prefork", 1, gossip=True, supervised=True).start(),
    ]
    app = create_celery(s, set_as_current=False)
    ids = []
    try:
        for n in range(RESTARTS):
            batch = [
                submit(sessions, app, "video", f"one two three four five six {n}.{i}", **TINY)
                for i in range(JOBS_PER_ROUND)
            ]
            ids += batch
            # Some of this round running, the text worker's other threads waiting in BRPOP.
            wait_for(lambda b=batch: _any_started(sessions, b), 60, 0.1, f"a job of round {n + 1} to start")
            own_redis.stop()
            time.sleep(DOWN_S)  # the outage itself: what is under test is what happens across it
            own_redis.start()  # same port, same append-only file
            for w in workers:
                assert w.alive(), f"worker {w.name} is down after restart {n + 1}: {w.log_text()[-3000:]}"
        wait_for(lambda: _succeeded(sessions) == len(ids), 240, 0.5, f"all {len(ids)} jobs to succeed")
        # Alive, or back within a minute if supervision is restarting one (its backoff + start).
        wait_for(lambda: all(w.alive() for w in workers), 60, 0.5, "every worker to be up at the end")
        crashes = {w.name: w.crashes() for w in workers}
        restarts = {w.name: w.restarts() for w in workers}
        # The kombu patch keeps each Celery worker up; supervision is only the safety net.
        assert sum(crashes.values()) == 0, f"Celery crashed: {crashes}, supervisor restarts {restarts}"
        for kind in ("job.started", "job.text.completed", "job.succeeded"):
            per_job = _event_counts(sessions, kind)
            assert set(per_job) == set(ids) and set(per_job.values()) == {1}, kind  # once each
        with sessions() as db:
            assert not db.scalar(select(func.sum(Job.recoveries)))  # no reaper runs: none was needed
    finally:
        for w in workers:
            w.stop()
