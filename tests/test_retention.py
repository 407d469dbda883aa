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
    # A malformed query is a 422 whatever the job's state (the document's enums: tests/test_fuzz.py).
    bad = assert_problem(client.get(f"/v1/jobs/{jid}/content?variant=&format=gif"), 422)
    assert {e["field"] for e in bad["errors"]} == {"variant", "format"}
    assert _usage_jobs(client) == before
    assert_problem(client.delete(f"/v1/jobs/{uuid.uuid4()}"), 404)


@pytest.mark.parametrize("how", ["delete", "expire"])
def test_a_deleted_or_expired_job_is_never_a_cache_hit(how, client, settings, sessions, worker) -> None:
    first = wait_finished(client, _submit(client, prompt="a cached heron", modality="text"))
    hit = client.post(
        "/v1/jobs", json={"prompt": "a cached heron", "modality": "text", "params": {"seed": 5}}
    )
    assert hit.get_json()["cached"] is True
    if how == "delete":
        assert client.delete(f"/v1/jobs/{first['id']}").status_code == 204
    else:
        _expire(sessions, first["id"])
        assert retention_task.expire(_runtime(settings, sessions)) == 1
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


def _completed(body: dict[str, Any]) -> datetime:
    return datetime.fromisoformat(body["timings"]["completed_at"].replace("Z", "+00:00"))


def _at(iso: str) -> datetime:
    return datetime.fromisoformat(iso.replace("Z", "+00:00"))


def test_a_plans_retention_sets_expires_at_and_what_the_retention_task_removes(
    client, tenant_client, settings, sessions, worker
) -> None:
    short = tenant_client("acme-short", retention_s=600)
    forever = tenant_client("acme-forever", retention_s=0)
    default_id = wait_finished(client, _submit(client, prompt="a kite, default", modality="text"))["id"]
    short_job = wait_finished(short, _submit(short, prompt="a kite, short", modality="text"))
    forever_job = wait_finished(forever, _submit(forever, prompt="a kite, forever", modality="text"))
    assert _at(short_job["expires_at"]) == _completed(short_job) + timedelta(seconds=600)
    assert forever_job["expires_at"] is None  # the plan keeps them forever
    default_job = client.get(f"/v1/jobs/{default_id}").get_json()
    assert _at(default_job["expires_at"]) == _completed(default_job) + timedelta(seconds=settings.retention_s)

    _expire(sessions, short_job["id"], retention_s=600)  # past the short plan's retention only
    rt = _runtime(settings, sessions)
    assert retention_task.expire(rt) == 1
    assert short.get(f"/v1/jobs/{short_job['id']}").get_json()["data_removed"] is True
    assert client.get(f"/v1/jobs/{default_id}").get_json()["data_removed"] is False

    _expire(sessions, default_id, forever_job["id"])  # past the default retention
    assert retention_task.expire(rt) == 1
    assert client.get(f"/v1/jobs/{default_id}").get_json()["data_removed"] is True
    assert forever.get(f"/v1/jobs/{forever_job['id']}").get_json()["data_removed"] is False
    # A default of 0 keeps the default plan's jobs forever, not the jobs of a plan with its own.
    again = wait_finished(short, _submit(short, prompt="a kite, short again", modality="text"))
    _expire(sessions, again["id"], retention_s=600)
    assert retention_task.expire(_runtime(settings, sessions, retention_s=0)) == 1


def test_a_plans_link_lifetime_bounds_the_signed_links(make_app, sessions, worker) -> None:
    from tests.support.api import authed_client_class, make_api_key

    app = make_app(media_url_keys=SecretStr("plan-ttl-media-key"))
    short = authed_client_class(make_api_key(sessions, "acme-links", media_url_ttl_s=120))(
        app, app.response_class, True
    )
    anon = FlaskClient(app, app.response_class)
    for who, ttl in ((app.test_client(), 3600), (short, 120)):
        done = wait_finished(who, _submit(who, prompt=f"a link for {ttl}", modality="text"))
        left = (_at(done["outputs"]["signed_urls_expire_at"]) - utcnow()).total_seconds()
        assert ttl - min(300, ttl // 10) - 5 <= left <= ttl  # the plan's lifetime, less its step
        assert anon.get(_local(done["outputs"]["text_signed_url"])).status_code == 200


@pytest.mark.parametrize(
    ("limit", "value", "message"),
    [
        ("media_url_ttl_s", 30, "media_url_ttl_s must be 60 to 604800"),
        ("media_url_ttl_s", 8 * DAY, "media_url_ttl_s must be 60 to 604800"),
        ("retention_s", -1, "retention_s must be a non-negative integer"),
    ],
)
def test_plan_lifetimes_outside_the_settings_bounds_are_refused(limit: str, value: int, message: str) -> None:
    from models.plans import check_overrides

    with pytest.raises(ValueError, match=message):
        check_overrides({limit: value})
    fine = {"retention_s": 60, "media_url_ttl_s": 60}
    assert check_overrides(fine) == fine
