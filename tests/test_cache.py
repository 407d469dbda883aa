"""Result cache and in-flight coalescing: keys, hits without the queues, followers of a running job."""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from typing import Any

import pytest

from app import create_app
from models import Job
from models.cache import cache_key
from tests.support.api import wait_finished
from tests.support.jobs import broker_idle, broker_messages
from tests.support.workers import in_process_worker, thread_workers


def submit(client, prompt: str = "a fox", modality: str = "text", headers: Any = None, **body: Any):
    params = body.pop("params", {"seed": 7})
    payload = {"prompt": prompt, "modality": modality, "params": params, **body}
    return client.post("/v1/jobs", json=payload, headers=headers or {})


@pytest.fixture
def later_worker(celery_app, sessions, broker):
    """Start a real worker only when the test says so (jobs queue up first)."""
    with ExitStack() as stack:
        yield lambda: stack.enter_context(in_process_worker(celery_app, concurrency=2))


# --- keys ---------------------------------------------------------------------------------------


def test_cache_key_covers_prompt_params_and_model_versions(settings) -> None:
    params = {"seed": 1, "max_new_tokens": 64, "temperature": 0.0}
    key = cache_key(settings, "text", "a  red\n fox", params)
    assert key == cache_key(settings, "text", "a red fox", dict(reversed(params.items())))
    assert len(key) == 64
    different = [
        cache_key(settings, "text", "a red cat", params),
        cache_key(settings, "text", "a red fox", params | {"seed": 2}),
        cache_key(settings, "text", "a red fox", params | {"temperature": 0.5}),
        cache_key(settings, "video", "a red fox", params),
        cache_key(settings.model_copy(update={"text_model": "smollm2"}), "text", "a red fox", params),
        cache_key(settings.model_copy(update={"cache_version": "2"}), "text", "a red fox", params),
    ]
    assert key not in different and len(set(different)) == len(different)
    # The video model is part of a video job's key only.
    other_video = settings.model_copy(update={"video_model": "wan-tiny"})
    assert cache_key(other_video, "text", "a red fox", params) == key
    assert cache_key(other_video, "video", "a red fox", params) != different[3]


# --- finished results ---------------------------------------------------------------------------


@contextmanager
def published() -> Iterator[list[str]]:
    """Names of the tasks this process publishes meanwhile (Celery's before_task_publish)."""
    from celery.signals import before_task_publish

    sent: list[str] = []

    def record(sender: str | None = None, **_: Any) -> None:
        sent.append(str(sender))

    before_task_publish.connect(record, weak=False)
    try:
        yield sent
    finally:
        before_task_publish.disconnect(record)


def test_identical_seeded_request_is_answered_from_the_finished_job(client, settings, broker) -> None:
    with thread_workers(settings):
        first = submit(client).get_json()
        assert first["cached"] is False
        done = wait_finished(client, first["id"])
    assert done["status"] == "succeeded"
    broker.flushdb()
    # No worker consumes now: a message the hit published would still be waiting in a queue.
    with published() as sent:
        resp = submit(client, prompt="  a   fox ")
    assert resp.status_code == 200
    hit = resp.get_json()
    assert hit["id"] != first["id"]
    assert (hit["status"], hit["cached"], hit["source_job_id"]) == ("succeeded", True, first["id"])
    assert hit["outputs"]["text"] == done["outputs"]["text"] and hit["progress"] == 100
    assert hit["timings"]["gpu_s"] is None  # no model ran for it
    assert sent == [] and broker_idle(broker)  # the queues never saw it
    assert client.get(f"/v1/jobs/{hit['id']}").get_json()["cached"] is True
    scrape = client.get("/metrics").get_data(as_text=True)
    assert 'genqueue_cache_hits_total{kind="result",modality="text"} 1.0' in scrape
    assert 'kind="follower"' not in scrape


def test_cache_false_unseeded_or_different_requests_compute(client, worker) -> None:
    first = submit(client).get_json()
    wait_finished(client, first["id"])
    for kwargs in (
        {"cache": False},
        {"params": {}},  # no seed given: a fresh random one, so not the same request
        {"params": {"seed": 8}},
        {"priority": "high", "params": {"seed": 7, "max_new_tokens": 3}},
    ):
        job = submit(client, **kwargs).get_json()
        assert job["cached"] is False and job["source_job_id"] is None, kwargs
        assert wait_finished(client, job["id"])["status"] == "succeeded"


def test_a_model_change_invalidates_the_cache(client, worker, settings, sessions, api_key) -> None:
    from tests.support.api import authed_client_class

    first = submit(client).get_json()
    wait_finished(client, first["id"])
    bumped_app = create_app(settings.model_copy(update={"cache_version": "2"}))
    bumped_app.test_client_class = authed_client_class(api_key)
    bumped = bumped_app.test_client()
    job = submit(bumped).get_json()
    assert job["cached"] is False
    assert wait_finished(bumped, job["id"])["status"] == "succeeded"


def test_a_video_hit_needs_the_source_files(client, worker, settings) -> None:
    params = {"seed": 3, "width": 64, "height": 64, "num_frames": 1, "steps": 1}
    first = wait_finished(client, submit(client, modality="video", params=params).get_json()["id"])
    hit = submit(client, modality="video", params=params).get_json()
    assert hit["cached"] is True and hit["outputs"]["video_url"]
    assert client.get(hit["outputs"]["video_url"]).status_code == 200
    for f in (settings.artifact_dir / first["id"]).iterdir():
        f.unlink()
    miss = submit(client, modality="video", params=params).get_json()
    assert miss["cached"] is False


# --- in-flight coalescing -----------------------------------------------------------------------


def test_identical_jobs_attach_to_the_running_one(client, later_worker, broker, sessions) -> None:
    params = {"seed": 5, "width": 64, "height": 64, "num_frames": 1, "steps": 1}
    leader = submit(client, modality="video", params=params).get_json()
    followers = [submit(client, modality="video", params=params).get_json() for _ in range(3)]
    for f in followers:
        assert (f["status"], f["cached"], f["source_job_id"]) == ("queued", True, leader["id"])
        assert f["queue_position"] is None
    assert len(broker_messages(broker, "text")) == 1  # one computation queued, not four
    scrape = client.get("/metrics").get_data(as_text=True)
    assert 'genqueue_cache_hits_total{kind="follower",modality="video"} 3.0' in scrape
    later_worker()
    done = wait_finished(client, leader["id"])
    assert done["status"] == "succeeded" and done["cached"] is False
    for f in followers:
        job = wait_finished(client, f["id"])
        assert (job["status"], job["cached"]) == ("succeeded", True)
        assert job["outputs"]["text"] == done["outputs"]["text"]
        assert client.get(job["outputs"]["video_url"]).data == client.get(done["outputs"]["video_url"]).data
    with sessions() as s:
        assert s.get(Job, uuid.UUID(followers[0]["id"])).attempts == 0  # never ran


def test_followers_fail_with_their_source(client, later_worker) -> None:
    leader = submit(client, prompt="please [[fail]]").get_json()
    follower = submit(client, prompt="please [[fail]]").get_json()
    assert follower["cached"] is True
    later_worker()
    assert wait_finished(client, leader["id"])["status"] == "failed"
    job = wait_finished(client, follower["id"])
    assert (job["status"], job["error"]["code"]) == ("failed", "invalid_request")
    assert leader["id"] in job["error"]["message"]


def test_canceling_the_source_hands_the_work_to_a_follower(client, later_worker, broker) -> None:
    leader = submit(client).get_json()
    second = submit(client).get_json()
    third = submit(client).get_json()
    assert client.post(f"/v1/jobs/{leader['id']}/cancel").get_json()["status"] == "canceled"
    heir = client.get(f"/v1/jobs/{second['id']}").get_json()
    assert (heir["status"], heir["cached"], heir["source_job_id"]) == ("queued", False, None)
    assert client.get(f"/v1/jobs/{third['id']}").get_json()["source_job_id"] == second["id"]
    later_worker()
    assert wait_finished(client, second["id"])["status"] == "succeeded"
    job = wait_finished(client, third["id"])
    assert (job["status"], job["cached"]) == ("succeeded", True)


def test_canceling_a_follower_leaves_its_source_alone(client, later_worker) -> None:
    leader = submit(client).get_json()
    follower = submit(client).get_json()
    assert client.post(f"/v1/jobs/{follower['id']}/cancel").get_json()["status"] == "canceled"
    later_worker()
    assert wait_finished(client, leader["id"])["status"] == "succeeded"
    assert client.get(f"/v1/jobs/{follower['id']}").get_json()["status"] == "canceled"


# --- Prefer: wait -------------------------------------------------------------------------------


def test_prefer_wait_returns_the_finished_job(client, worker) -> None:
    resp = submit(client, params={}, headers={"Prefer": "wait=20"})
    assert resp.status_code == 200 and resp.get_json()["status"] == "succeeded"
    assert resp.headers["Location"] == f"/v1/jobs/{resp.get_json()['id']}"


def test_prefer_wait_gives_up_after_n_seconds(client) -> None:
    started = time.monotonic()
    resp = submit(client, params={}, headers={"Prefer": "respond-async, wait=1"})  # no worker runs
    assert resp.status_code == 202 and resp.get_json()["status"] == "queued"
    assert time.monotonic() - started >= 1


def test_the_cache_is_per_tenant(client, tenant_client, worker, sessions) -> None:
    first = submit(client).get_json()
    wait_finished(client, first["id"])
    assert submit(client).get_json()["cached"] is True
    other = submit(tenant_client("acme")).get_json()
    assert other["cached"] is False and other["source_job_id"] is None
