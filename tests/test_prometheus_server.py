"""A real Prometheus scraping a running stack with the alert rules loaded (docs/OPERATIONS.md, "Alerts").

The stack's web (2 gunicorn workers), text and default workers and the exporter run as one
`bin/start`; the video worker as a second one, started later: its queue fills with no worker at
all (its target down, as when the process is gone), which must fire GenqueueQueueWithoutConsumer,
and clear once the worker is back and drains it. Prometheus's own answers must count exactly the
requests sent, the jobs run and their stages. The rules' `for:` are shortened to 2 s.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select

from models import Job
from tests.support.api import make_api_key
from tests.support.procs import ROOT, free_port, wait_for
from tests.support.prometheus import PrometheusServer, rules_with_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("prometheus") is None, reason="prometheus not installed (bin/services does)"
    ),
]

VIDEO_JOBS, TEXT_JOBS = 3, 2
FINISHED = ("succeeded", "failed", "canceled")


@pytest.fixture
def ports() -> dict[str, int]:
    names = ("PORT", "EXPORTER_PORT", "TEXT_WORKER_METRICS_PORT", "VIDEO_WORKER_METRICS_PORT")
    return {name: free_port() for name in (*names, "DEFAULT_WORKER_METRICS_PORT")}


@pytest.fixture
def env(settings, sessions, broker, ports, tmp_path) -> dict[str, str]:
    """The test's database, Redis db and free ports; the echo models (the metrics are the subject)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith(("GENQUEUE_", "FLOWER_"))}
    return base | {k: str(v) for k, v in ports.items()} | {
        "VIRTUAL_ENV": str(Path(sys.executable).parent.parent),
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": settings.database_url,
        "BROKER_URL": settings.broker_url,
        "GENQUEUE_ARTIFACT_DIR": str(settings.artifact_dir),
        "GENQUEUE_TEXT_MODEL": "echo",
        "GENQUEUE_VIDEO_MODEL": "echo",
        "GENQUEUE_WORKER_METRICS_DIR": str(tmp_path / "worker-metrics"),
        "GENQUEUE_STOP_TIMEOUT_S": "20",
        "HOST": "127.0.0.1",
        "WEB_CONCURRENCY": "2",
    }  # fmt: skip


class Stack:
    """`bin/start NAMES...` in its own session, logging to a file."""

    def __init__(self, env: dict[str, str], names: list[str], log: Path) -> None:
        self.log = log
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                ["bin/start", *names], cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT,
                start_new_session=True,
            )  # fmt: skip

    def alive(self) -> None:
        assert self.proc.poll() is None, self.log.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGTERM)  # the stack forwards it to every process group
            try:
                self.proc.wait(40)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


@pytest.fixture
def stacks(tmp_path) -> Iterator[list[Stack]]:
    started: list[Stack] = []
    yield started
    for stack in reversed(started):
        stack.stop()


@pytest.fixture
def prometheus(tmp_path, ports) -> Iterator[PrometheusServer]:
    def target(name: str) -> list[str]:
        return [f"127.0.0.1:{ports[name]}"]

    jobs = {
        "genqueue-web": target("PORT"),
        "genqueue-exporter": target("EXPORTER_PORT"),
        "genqueue-workers": [f"127.0.0.1:{ports[p]}" for p in ports if p.endswith("WORKER_METRICS_PORT")],
    }
    server = PrometheusServer(tmp_path, jobs, rules_with_for(tmp_path / "rules.yml", "2s"))
    yield server
    server.stop()


def _submit(web: str, headers: dict[str, str], modality: str, i: int) -> httpx.Response:
    body: dict[str, Any] = {"prompt": f"a paper boat {i}", "modality": modality, "cache": False}
    return httpx.post(f"{web}/v1/jobs", json=body, headers=headers, timeout=10)


def test_prometheus_counts_the_stack_and_alerts_on_a_queue_without_worker(
    env, ports, sessions, stacks, prometheus, tmp_path
) -> None:
    headers = {"Authorization": f"Bearer {make_api_key(sessions)}"}
    web = f"http://127.0.0.1:{ports['PORT']}"
    log = tmp_path / "stack.log"
    stacks.append(Stack(env, ["web", "worker_text", "worker_default", "exporter"], log))
    p = prometheus

    def targets_up() -> bool:
        stacks[0].alive()
        up = {labels[1][1]: v for labels, v in p.query("up").items()}  # instance -> 0/1
        video = f"127.0.0.1:{ports['VIDEO_WORKER_METRICS_PORT']}"
        if not (len(up) == 5 and up[video] == 0 and all(v == 1 for i, v in up.items() if i != video)):
            return False
        consuming = p.query("sum by (queue) (genqueue_worker_consuming)")  # once the consumers started
        return {dict(k)["queue"]: v for k, v in consuming.items()} == {"text": 1, "default": 1, "webhooks": 1}

    wait_for(targets_up, 90, 0.5, "every target but the video worker up, its consumers started")
    assert p.value('sum(genqueue_worker_consuming{queue="video"})') is None  # no process at all
    assert p.firing("GenqueueQueueWithoutConsumer") == []  # nothing waits anywhere yet

    # Jobs, with no video worker: text stages run, video stages wait in their queue.
    accepted = [_submit(web, headers, "video", i) for i in range(VIDEO_JOBS)]
    accepted += [_submit(web, headers, "text", i) for i in range(TEXT_JOBS)]
    assert [r.status_code for r in accepted] == [202] * (VIDEO_JOBS + TEXT_JOBS), [r.text for r in accepted]
    bad = httpx.post(f"{web}/v1/jobs", json={"prompt": "", "modality": "text"}, headers=headers, timeout=10)
    assert bad.status_code == 422, bad.text
    ids = [uuid.UUID(r.json()["id"]) for r in accepted]

    wait_for(
        lambda: p.value('sum(genqueue_queue_depth{queue="video"})') == VIDEO_JOBS,
        60, 0.5, "the video queue to hold the video jobs in Prometheus",
    )  # fmt: skip
    firing = wait_for(lambda: p.firing("GenqueueQueueWithoutConsumer"), 30, 0.5, "the alert to fire")
    assert [(a["queue"], a["severity"]) for a in firing] == [("video", "critical")]

    # The video worker comes back and drains its queue: the alert clears.
    stacks.append(Stack(env, ["worker_video"], log))

    def statuses() -> list[str]:
        with sessions() as s:
            return list(s.scalars(select(Job.status).where(Job.id.in_(ids))))

    wait_for(lambda: all(st in FINISHED for st in statuses()), 90, 0.5, "every job to finish")
    assert statuses() == ["succeeded"] * len(ids)

    def cleared() -> bool:
        return (
            p.value('sum(genqueue_worker_consuming{queue="video"})') == 1
            and p.value('sum(genqueue_queue_depth{queue="video"})') == 0
            and not p.firing("GenqueueQueueWithoutConsumer")
        )

    wait_for(cleared, 30, 0.5, "the video worker in Prometheus and the alert cleared")

    # Prometheus's numbers: exactly what was sent and run, summed over processes and targets.
    def settled() -> bool:
        return (
            p.value("sum(genqueue_jobs_finished_total)") == len(ids)
            and p.value('sum(genqueue_http_requests_total{endpoint="/v1/jobs",method="POST"})')
            == len(ids) + 1
        )

    wait_for(settled, 20, 0.5, "the last counts to be scraped")
    posts = p.query('sum by (status) (genqueue_http_requests_total{endpoint="/v1/jobs",method="POST"})')
    assert {dict(k)["status"]: v for k, v in posts.items()} == {"202": len(ids), "422": 1}
    assert (
        p.value('sum(genqueue_http_request_duration_seconds_count{endpoint="/v1/jobs",method="POST"})')
        == len(ids) + 1
    )
    problems = p.query("sum by (status, type) (genqueue_http_problems_total)")
    assert {tuple(dict(k).values()): v for k, v in problems.items()} == {("422", "validation-failed"): 1}
    submitted = p.query("sum by (modality) (genqueue_jobs_submitted_total)")
    assert {dict(k)["modality"]: v for k, v in submitted.items()} == {"video": VIDEO_JOBS, "text": TEXT_JOBS}
    outcomes = p.query("sum by (status, error_code) (genqueue_jobs_finished_total)")
    assert {tuple(sorted(dict(k).items())): v for k, v in outcomes.items()} == {
        (("error_code", "none"), ("status", "succeeded")): len(ids)
    }
    for metric, label, want in (
        ("genqueue_queue_wait_seconds_count", "stage", {"text": len(ids), "video": VIDEO_JOBS}),
        ("genqueue_stage_duration_seconds_count", "stage", {"text": len(ids), "video": VIDEO_JOBS}),
        ("genqueue_job_duration_seconds_count", "status", {"succeeded": len(ids)}),
    ):
        counts = p.query(f"sum by ({label}) ({metric})")
        assert {dict(k)[label]: v for k, v in counts.items()} == want, metric
    # The video jobs waited in their queue while no worker was there: longer than any text wait.
    waits = p.query("sum by (stage) (genqueue_queue_wait_seconds_sum)")
    assert {dict(k)["stage"]: v for k, v in waits.items()}["video"] > 2.0
    # The depth rose to the video jobs and fell back to zero.
    assert p.value('max_over_time(sum(genqueue_queue_depth{queue="video"})[5m:1s])') == VIDEO_JOBS
    assert p.value('sum(genqueue_queue_depth{queue="video"})') == 0
    # Nothing else fires on a healthy stack once every target is up.
    others = {a["labels"]["alertname"] for a in p.alerts() if a["state"] == "firing"}
    assert others <= {"GenqueueTargetDown"}, others
    wait_for(lambda: not p.firing("GenqueueTargetDown"), 20, 0.5, "every target up")
