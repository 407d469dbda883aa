"""`genqueue exporter`: queue depths from real Redis and RabbitMQ, jobs and webhook backlog from Postgres."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import httpx
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from app.exporter import ExporterCollector
from app.queue_depth import QueueDepths
from models import Job, JobEvent
from models.base import utcnow
from models.db import transaction
from models.tenant import DEFAULT_TENANT_ID
from models.webhook import WebhookDelivery, WebhookEndpoint, WebhookMessage
from tasks.contract.publish import publish_job
from tests.support.procs import ROOT, RabbitVhost, free_port, rabbitmq_available, wait_for, worker_env

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def samples(exposition: str) -> Samples:
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(exposition)
        for s in family.samples
    }


def scrape(settings) -> Samples:
    registry = CollectorRegistry()
    collector = ExporterCollector(settings)
    registry.register(collector)
    try:
        return samples(generate_latest(registry).decode())
    finally:
        collector.close()


def depth(seen: Samples, queue: str, priority: str) -> float:
    return seen[("genqueue_queue_depth", (("priority", priority), ("queue", queue)))]


def up(seen: Samples, source: str) -> float:
    return seen[("genqueue_exporter_up", (("source", source),))]


def publish_jobs(settings) -> None:
    """3 high, 2 normal and 1 low text jobs, 1 normal video-stage message; no worker consumes them."""
    from tasks.celery_app import create_celery

    app = create_celery(settings, set_as_current=False)
    for priority, n in (("high", 3), ("normal", 2), ("low", 1)):
        for _ in range(n):
            publish_job(app, uuid.uuid4(), "text", priority)
    publish_job(app, uuid.uuid4(), "video", "normal", stage="video")


def test_redis_depth_per_queue_and_priority(settings, sessions, broker):
    publish_jobs(settings)
    seen = scrape(settings)
    assert up(seen, "broker") == 1 and up(seen, "database") == 1
    assert [depth(seen, "text", p) for p in ("high", "normal", "low")] == [3, 2, 1]
    assert [depth(seen, "video", p) for p in ("high", "normal", "low")] == [0, 1, 0]
    assert depth(seen, "default", "normal") == 0 and depth(seen, "webhooks", "high") == 0
    # The lists are kombu's own: exactly the keys the publish wrote.
    assert sum(broker.llen(k) for k in broker.keys("text*")) == 6


@pytest.fixture
def rabbit() -> Iterator[RabbitVhost]:
    if not rabbitmq_available():
        pytest.skip("RabbitMQ is not running on 127.0.0.1:5672")
    vhost = RabbitVhost().create()
    yield vhost
    vhost.delete()


def test_rabbitmq_depth_per_queue(settings, sessions, rabbit):
    amqp = settings.model_copy(update={"broker_url": rabbit.url})
    before = scrape(amqp)  # nothing declared yet: every queue reads 0, not an error
    assert up(before, "broker") == 1
    assert {depth(before, q, "all") for q in ("text", "video", "default", "webhooks")} == {0}
    publish_jobs(amqp)
    seen = scrape(amqp)
    assert up(seen, "broker") == 1
    assert depth(seen, "text", "all") == 6 and depth(seen, "video", "all") == 1
    assert depth(seen, "default", "all") == 0


def test_jobs_by_status_and_webhook_backlog(settings, sessions, engine):
    # Each status at least twice: the planner's statistics keep the values seen more than once.
    rows = [("queued", "text")] * 3 + [("queued", "video")] * 2 + [("running", "video")] * 2
    rows += [("succeeded", "text")] * 4 + [("failed", "video")] * 2 + [("canceled", "text")] * 2
    with transaction(sessions) as s:
        jobs = [Job(modality=m, prompt="p", params={}, status=st) for st, m in rows]
        s.add_all(jobs)
        s.flush()
        endpoint = WebhookEndpoint(tenant_id=DEFAULT_TENANT_ID, url="https://example.com/hooks")
        events = [JobEvent(job_id=jobs[0].id, type="job.succeeded") for _ in range(3)]
        s.add_all([endpoint, *events])
        s.flush()
        # One message not fanned out yet; of the others, one delivery still pending.
        s.add(WebhookMessage(id=events[0].id, job_id=jobs[0].id, type="job.succeeded", snapshot={}))
        s.add_all(
            WebhookMessage(
                id=e.id, job_id=jobs[0].id, type="job.succeeded", snapshot={}, fanned_out_at=utcnow()
            )
            for e in events[1:]
        )
        s.flush()
        s.add(
            WebhookDelivery(
                message_id=events[1].id,
                endpoint_id=endpoint.id,
                job_id=jobs[0].id,
                event_type="job.succeeded",
            )
        )
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        conn.execute(text("ANALYZE jobs"))  # the estimates come from the planner's statistics
    seen = scrape(settings)
    jobs_by = {labels: v for (name, labels), v in seen.items() if name == "genqueue_jobs"}
    assert jobs_by == {
        (("modality", "text"), ("status", "queued")): 3,
        (("modality", "video"), ("status", "queued")): 2,
        (("modality", "text"), ("status", "running")): 0,
        (("modality", "video"), ("status", "running")): 2,
        (("modality", "image"), ("status", "queued")): 0,
        (("modality", "image"), ("status", "running")): 0,
        (("modality", "storyboard"), ("status", "queued")): 0,
        (("modality", "storyboard"), ("status", "running")): 0,
    }
    estimated = {
        dict(labels)["status"]: v for (name, labels), v in seen.items() if name == "genqueue_jobs_estimated"
    }
    assert estimated == {"queued": 5, "running": 2, "succeeded": 4, "failed": 2, "canceled": 2}
    assert seen[("genqueue_webhook_outbox_messages", ())] == 1
    assert seen[("genqueue_webhook_deliveries_pending", ())] == 1


def test_a_down_source_reads_up_0_and_the_scrape_does_not_wait(settings, sessions):
    dead = settings.model_copy(
        update={
            "broker_url": "redis://127.0.0.1:1/0",
            "database_url": "postgresql+psycopg://postgres@127.0.0.1:1/none",
            "exporter_timeout_s": 1.0,
        }
    )
    started = time.monotonic()
    seen = scrape(dead)
    assert time.monotonic() - started < 3
    assert up(seen, "broker") == 0 and up(seen, "database") == 0
    assert not [k for k in seen if k[0] in ("genqueue_queue_depth", "genqueue_jobs")]


def test_a_hanging_source_is_cut_at_the_deadline(settings, sessions, broker, monkeypatch):
    def hang(self) -> dict:
        time.sleep(5)
        return {}

    monkeypatch.setattr(QueueDepths, "read", hang)
    started = time.monotonic()
    seen = scrape(settings.model_copy(update={"exporter_timeout_s": 0.5}))
    assert time.monotonic() - started < 2
    assert up(seen, "broker") == 0 and up(seen, "database") == 1  # the database still reported
    assert ("genqueue_jobs", (("modality", "text"), ("status", "queued"))) in seen


def test_the_series_are_the_same_whatever_the_data(settings, sessions, broker):
    """No job ids, tenants or free text in labels: more jobs and messages add no series."""
    empty = set(scrape(settings))
    publish_jobs(settings)
    with transaction(sessions) as s:
        s.add_all(Job(modality="text", prompt=f"p{i}", params={}) for i in range(50))
    assert set(scrape(settings)) == empty
    assert len([k for k in empty if k[0] == "genqueue_queue_depth"]) == 6 * 3  # queues x priorities
    assert {k for _, labels in empty for k, _ in labels} <= {
        "queue",
        "priority",
        "status",
        "modality",
        "source",
    }


def test_the_exporter_process_serves_metrics_and_stops_on_sigterm(settings, sessions, broker, tmp_path):
    publish_jobs(settings)
    port = free_port()
    log = (tmp_path / "exporter.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.cli", "exporter", "--host", "127.0.0.1", "--port", str(port)],
        cwd=ROOT, env=worker_env(settings), stdout=log, stderr=subprocess.STDOUT,
    )  # fmt: skip

    def get() -> httpx.Response | None:
        assert proc.poll() is None, (tmp_path / "exporter.log").read_text()
        try:
            return httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5)
        except httpx.HTTPError:
            return None

    try:
        resp = wait_for(get, 30, what="the exporter")
        seen = samples(resp.text)
        assert up(seen, "broker") == 1 and up(seen, "database") == 1
        assert depth(seen, "text", "high") == 3
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
