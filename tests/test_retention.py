"""Retention and deletion: expires_at, the retention task, DELETE /v1/jobs/{id}, with real workers."""

from __future__ import annotations

import os
import threading
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from flask.testing import FlaskClient
from pydantic import SecretStr
from sqlalchemy import update

from models import Job
from models.base import utcnow
from models.db import transaction
from tasks import retention as retention_task
from tasks.config import celery_config
from tasks.contract import names
from tasks.runtime import Runtime
from tests.support.api import assert_problem, wait_finished
from tests.support.jobs import events, files, get
from tests.support.procs import wait_for
from tests.support.workers import thread_workers

VIDEO = {"seed": 5, "width": 64, "height": 64, "num_frames": 1, "steps": 1}
DAY = 24 * 3600


def _submit(client: Any, prompt: str = "a heron at dawn", modality: str = "video", **body: Any) -> str:
    params = body.pop("params", VIDEO if modality == "video" else {"seed": 5})
    resp = client.post("/v1/jobs", json={"prompt": prompt, "modality": modality, "params": params, **body})
    assert resp.status_code in (200, 202), resp.get_json()
    return str(resp.get_json()["id"])


def _expire(sessions: Any, *ids: str, retention_s: int = 7 * DAY) -> None:
    """Move the jobs' completion back past the retention period."""
    with transaction(sessions) as s:
        s.execute(
            update(Job)
            .where(Job.id.in_([uuid.UUID(i) for i in ids]))
            .values(completed_at=utcnow() - timedelta(seconds=retention_s + 60))
        )


def _runtime(settings: Any, sessions: Any, **overrides: Any) -> Runtime:
    engine = sessions.kw["bind"]
    return Runtime(settings.model_copy(update=overrides), engine, sessions, os.getpid())


def _local(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.path}?{parts.query}"


def _usage_jobs(client: Any) -> dict[str, int]:
    start = (utcnow() - timedelta(days=30)).isoformat().replace("+00:00", "Z")
    resp = client.get("/v1/usage", query_string={"from": start})
    assert resp.status_code == 200, resp.get_json()
    jobs: dict[str, int] = resp.get_json()["total"]["jobs"]
    return jobs


def test_a_finished_job_expires_retention_s_after_it_completed(client, settings, worker) -> None:
    queued = client.post("/v1/jobs", json={"prompt": "a lark", "modality": "text"}).get_json()
    assert queued["expires_at"] is None and queued["data_removed"] is False
    done = wait_finished(client, queued["id"])
    completed = done["timings"]["completed_at"].replace("Z", "+00:00")
    expected = datetime.fromisoformat(completed) + timedelta(seconds=settings.retention_s)
    assert datetime.fromisoformat(done["expires_at"].replace("Z", "+00:00")) == expected
    assert done["data_removed"] is False


def test_the_retention_task_removes_expired_data_and_keeps_the_row(
    make_app, settings, sessions, celery_app
) -> None:
    app = make_app(media_url_keys=SecretStr("retention-media-key"))
    client, anon = app.test_client(), FlaskClient(app, app.response_class)
    with thread_workers(settings):
        jid = _submit(client, prompt="a heron at dawn, expiring")
        done = wait_finished(client, jid)
        keep = wait_finished(client, _submit(client, prompt="a heron kept"))
        assert done["status"] == "succeeded" and files(settings.artifact_dir, uuid.UUID(jid))
        links = done["outputs"]
        assert anon.get(_local(links["video_signed_url"])).status_code == 200
        before = _usage_jobs(client)
        _expire(sessions, jid)
        # The beat's task, by its stable name, run by a real worker.
        celery_app.send_task(names.EXPIRE_ARTIFACTS)
        wait_for(lambda: get(sessions, uuid.UUID(jid)).data_removed_at is not None, 30, what="retention")
    assert files(settings.artifact_dir, uuid.UUID(jid)) == []
    body = client.get(f"/v1/jobs/{jid}").get_json()
    assert body["data_removed"] is True and body["prompt"] == "" and body["status"] == "succeeded"
    assert body["outputs"]["text"] is None and body["outputs"]["video_url"] is None
    assert body["outputs"]["video_signed_url"] is None
    for variant in ("video", "text", "thumbnail"):
        assert_problem(client.get(f"/v1/jobs/{jid}/content?variant={variant}"), 410)
        # A link handed out before the removal stops working too: 410, never the bytes.
        assert_problem(anon.get(_local(links[f"{variant}_signed_url"])), 410)
    assert _usage_jobs(client) == before  # the row still counts
    assert client.get(f"/v1/jobs/{keep['id']}").get_json()["data_removed"] is False
    assert files(settings.artifact_dir, uuid.UUID(keep["id"]))


def test_the_retention_task_is_scheduled_on_the_default_queue(settings) -> None:
    conf = celery_config(settings.model_copy(update={"retention_interval_s": 42.0}))
    [entry] = [e for e in conf["beat_schedule"].values() if e["task"] == names.EXPIRE_ARTIFACTS]
    assert entry["schedule"] == 42.0 and entry["options"]["expires"] == 42.0
    assert conf["task_routes"][names.EXPIRE_ARTIFACTS] == {"queue": names.DEFAULT_QUEUE}
    assert "tasks.retention" in conf["include"]


def test_retention_is_bounded_idempotent_and_safe_twice_at_once(client, settings, sessions, worker) -> None:
    ids = [
        wait_finished(client, _submit(client, prompt=f"a wren {i}", modality="text"))["id"] for i in range(5)
    ]
    _expire(sessions, *ids)
    rt = _runtime(settings, sessions, retention_batch=2)
    assert retention_task.expire(rt) == 2  # bounded per run
    counts: list[int] = []
    passes = [threading.Thread(target=lambda: counts.append(retention_task.expire(rt))) for _ in range(2)]
    for t in passes:
        t.start()
    for t in passes:
        t.join()
    assert sum(counts) == 3  # two runs at once share the rest (SKIP LOCKED), none twice
    assert all(get(sessions, uuid.UUID(i)).data_removed_at is not None for i in ids)
    assert retention_task.expire(rt) == 0  # nothing left: a no-op
    assert retention_task.expire(_runtime(settings, sessions, retention_s=0)) == 0  # 0 keeps forever


def test_delete_a_finished_job_twice_and_across_tenants(
    client, tenant_client, settings, sessions, worker
) -> None:
    jid = _submit(client, prompt="a heron, deleted")
    wait_finished(client, jid)
    assert files(settings.artifact_dir, uuid.UUID(jid))
    before = _usage_jobs(client)
    assert_problem(tenant_client("acme-retention").delete(f"/v1/jobs/{jid}"), 404)
    assert client.get(f"/v1/jobs/{jid}").get_json()["data_removed"] is False  # untouched by the other
    first, again = client.delete(f"/v1/jobs/{jid}"), client.delete(f"/v1/jobs/{jid}")
    assert (first.status_code, again.status_code) == (204, 204) and first.data == b""
    assert files(settings.artifact_dir, uuid.UUID(jid)) == []
    body = client.get(f"/v1/jobs/{jid}").get_json()
    assert (body["status"], body["data_removed"], body["prompt"]) == ("succeeded", True, "")
    assert_problem(client.get(f"/v1/jobs/{jid}/content"), 410)
    assert _usage_jobs(client) == before
    assert_problem(client.delete(f"/v1/jobs/{uuid.uuid4()}"), 404)


def test_a_deleted_job_is_never_a_cache_hit(client, worker) -> None:
    first = wait_finished(client, _submit(client, prompt="a cached heron", modality="text"))
    hit = client.post(
        "/v1/jobs", json={"prompt": "a cached heron", "modality": "text", "params": {"seed": 5}}
    )
    assert hit.get_json()["cached"] is True
    assert client.delete(f"/v1/jobs/{first['id']}").status_code == 204
    again = client.post(
        "/v1/jobs", json={"prompt": "a cached heron", "modality": "text", "params": {"seed": 5}}
    )
    body = again.get_json()
    assert body["cached"] is False and body["source_job_id"] is None  # computed again
    assert wait_finished(client, body["id"])["status"] == "succeeded"


@pytest.mark.slow
def test_delete_a_running_job_cancels_and_compensates(
    client, settings, sessions, broker, monkeypatch
) -> None:
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.5")  # 100 steps: ~50 s uncanceled
    with thread_workers(settings, video_model="tests.support.generators:TracedVideo"):
        jid = _submit(client, prompt="a slow heron", params=VIDEO | {"steps": 100})
        wait_for(lambda: get(sessions, uuid.UUID(jid)).stage == "video", 60, what="the video stage")
        assert client.delete(f"/v1/jobs/{jid}").status_code == 204
        wait_for(lambda: "job.compensated" in events(sessions, uuid.UUID(jid)), 30, what="compensation")
    job = get(sessions, uuid.UUID(jid))
    assert (job.status, job.error_code) == ("canceled", "canceled") and job.data_removed_at is not None
    assert job.prompt == "" and job.output_text is None
    assert files(Path(settings.artifact_dir), uuid.UUID(jid)) == []
    assert client.delete(f"/v1/jobs/{jid}").status_code == 204
