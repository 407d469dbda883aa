"""Crashes: a process killed between its commit and the dispatch; a webhook worker killed mid-delivery."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from sqlalchemy import select
from werkzeug import Response

from models import Job, states
from models.db import transaction
from models.webhook import WebhookMessage
from tasks.contract import names
from tests.support.workers import in_process_worker
from tests.webhooks.helpers import secret

ROOT = Path(__file__).resolve().parents[2]

# Commits a real transition, then dies inside the after-commit hook, before it can publish
# the dispatch: exactly the window an outbox exists for.
KILLED_AFTER_COMMIT = """
import os, signal, sys, uuid
from models import outbox, states
from models.db import make_engine, make_session_factory, transaction
sessions = make_session_factory(make_engine(sys.argv[1]))
outbox.on_commit(sessions, lambda jobs: os.kill(os.getpid(), signal.SIGKILL))
with transaction(sessions) as s:
    assert states.cancel(s, uuid.UUID(sys.argv[2]))
print("survived", flush=True)
"""


def _env(hooks) -> dict[str, str]:
    return {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": hooks.database_url,
        "BROKER_URL": hooks.broker_url,
        "GENQUEUE_WEBHOOK_ALLOW_PRIVATE": "true",
        "GENQUEUE_WEBHOOK_RETRY_SCHEDULE_S": json.dumps(hooks.webhook_retry_schedule_s),
        "GENQUEUE_TEXT_MODEL": "echo",
        "GENQUEUE_VIDEO_MODEL": "echo",
        "HF_HUB_OFFLINE": "1",
    }


def _queued_job(sessions, url: str) -> uuid.UUID:
    job = Job(id=uuid.uuid4(), modality="text", prompt="p", params={}, webhook={"url": url})
    with transaction(sessions) as s:
        s.add(job)
    return job.id


def _waiting(broker, queue: str) -> int:
    return sum(broker.llen(k) for k in broker.scan_iter(match=f"{queue}*") if broker.type(k) == b"list")


@pytest.mark.slow
def test_killed_between_commit_and_dispatch_still_delivers(
    hooks, hook_client, hook_worker, receiver, sessions, broker
):
    job_id = _queued_job(sessions, receiver.url)
    run = subprocess.run(
        [sys.executable, "-c", KILLED_AFTER_COMMIT, hooks.database_url, str(job_id)],
        env=_env(hooks),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == -signal.SIGKILL and "survived" not in run.stdout, run.stderr
    with sessions() as s:
        assert s.get(Job, job_id).status == "canceled"  # the state change committed...
        [msg] = s.scalars(select(WebhookMessage).where(WebhookMessage.job_id == job_id)).all()
        assert msg.type == "job.canceled" and msg.fanned_out_at is None  # ...and so did its message
    time.sleep(1.0)
    assert receiver.calls == [] and _waiting(broker, names.WEBHOOKS_QUEUE) == 0, "no dispatch was sent"
    hook_worker.send_task(names.RELAY_WEBHOOKS)  # what beat does every few seconds
    receiver.wait_for(lambda r: len(r.delivered()) == 1)
    payload = receiver.verify(secret(hook_client), receiver.calls[0])
    assert (payload["type"], payload["data"]["id"]) == ("job.canceled", str(job_id))


@pytest.mark.slow
def test_webhook_worker_killed_mid_delivery_is_redelivered_with_the_same_id(
    hooks, hook_client, receiver, sessions, broker
):
    import tasks.webhooks  # noqa: F401  registers the delivery tasks
    from tasks.celery_app import create_celery

    in_flight, release = threading.Event(), threading.Event()

    def reply(n: int, payload: dict) -> Response:
        if n == 1:
            in_flight.set()
            release.wait(30)  # hold the first request open while its worker is killed
        return Response(status=200)

    receiver.reply = reply
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "tasks.worker", "worker", "-Q", names.WEBHOOKS_QUEUE,
         "-P", "threads", "-c", "2", "-l", "WARNING", "-n", f"hooks-{uuid.uuid4().hex[:6]}@%h"],
        env=_env(hooks), cwd=ROOT, start_new_session=True,
    )  # fmt: skip
    try:
        job_id = _queued_job(sessions, receiver.url)
        with transaction(hook_client.application.extensions["genqueue"].sessions) as s:
            assert states.cancel(s, job_id)  # commits the event; the hook publishes the dispatch
        assert in_flight.wait(60), "the subprocess worker never sent the webhook"
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)
    finally:
        if worker.poll() is None:
            os.killpg(worker.pid, signal.SIGKILL)
        release.set()
    # A fresh worker and the relay finish the job: the message goes out again, same webhook-id.
    app = create_celery(hooks, set_as_current=False)
    with in_process_worker(app, concurrency=2, shutdown_timeout=10):
        # As beat does: relay ticks until the overdue delivery has been picked up again.
        deadline = time.monotonic() + 60
        while len(receiver.calls) < 2 and time.monotonic() < deadline:
            app.send_task(names.RELAY_WEBHOOKS)
            time.sleep(1)
        receiver.wait_for(lambda r: len(r.calls) == 2, timeout=10)
    first, second = receiver.calls
    assert first.headers["Webhook-Id"] == second.headers["Webhook-Id"]
    assert receiver.verify(secret(hook_client), second)["type"] == "job.canceled"
