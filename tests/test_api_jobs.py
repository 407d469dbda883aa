"""The /v1 endpoints against the real Postgres and Redis: submit, read, list, cancel, content, health."""

from __future__ import annotations

import base64
import json
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import func, select

from models import Job, JobEvent, JobStatus, states
from models.db import transaction
from tests.support.api import assert_problem, submit
from tests.support.jobs import broker_messages
from tests.support.procs import wait_for

CLOSED_DB = "postgresql+psycopg://postgres@127.0.0.1:1/nothing"
CLOSED_BROKER = "redis://127.0.0.1:1/0"


def add_job(sessions, **fields: Any) -> Job:
    """A job row written directly, in any state the test needs."""
    values: dict[str, Any] = {"id": uuid.uuid4(), "modality": "text", "prompt": "p", "params": {}}
    job = Job(**(values | fields))
    with transaction(sessions) as s:
        s.add(job)
    return job


def job_count(sessions) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(Job)) or 0


# --- submit -----------------------------------------------------------------------------------


def test_submit_commits_publishes_and_answers_202(client, sessions, broker):
    resp = submit(client, priority="high", metadata={"user": "ann"})
    assert resp.status_code == 202
    job = resp.get_json()
    assert resp.headers["Location"] == f"/v1/jobs/{job['id']}"
    assert job["status"] == "queued" and job["queue_position"] == 1
    assert job["metadata"] == {"user": "ann"} and job["priority"] == "high"
    with sessions() as s:
        row = s.get(Job, uuid.UUID(job["id"]))
        assert row is not None and row.status == JobStatus.QUEUED
    # published_at is recorded in batches, a few tens of ms after the answer.

    def published_at() -> datetime | None:
        with sessions() as s:
            return s.scalar(select(Job.published_at).where(Job.id == uuid.UUID(job["id"])))

    wait_for(published_at, 5, 0.02, "published_at to be recorded")
    [message] = broker_messages(broker, "text")
    assert message["headers"]["id"] == f"{job['id']}.text"
    assert message["headers"]["task"] == "genqueue.generate_text"
    assert broker_messages(broker, "video") == []


def test_submit_stores_complete_params(client):
    text = submit(client).get_json()
    assert set(text["params"]) == {"max_new_tokens", "temperature", "seed"}
    assert text["params"]["max_new_tokens"] == 64 and text["params"]["temperature"] == 0.0
    video = submit(client, modality="video", params={"width": 512, "seed": 7}).get_json()
    assert video["params"] == {
        "width": 512, "height": 256, "num_frames": 17, "fps": 8, "steps": 8, "seed": 7,
        "max_new_tokens": 64, "temperature": 0.0, "allow_degraded": False,
    }  # fmt: skip


def test_submit_normalises_the_prompt(client):
    job = submit(client, prompt="  Cafe\u0301\r\nline\x00 two\x1b \t").get_json()
    assert job["prompt"] == "Caf\u00e9\nline two"


def test_submit_accepts_json_suffix_media_type_and_nulls(client):
    body = {"prompt": "p", "modality": "video", "params": None, "metadata": None, "priority": None}
    resp = client.post("/v1/jobs", data=json.dumps(body), content_type="application/vnd.api+json")
    assert resp.status_code == 202
    assert resp.get_json()["priority"] == "normal" and resp.get_json()["metadata"] == {}


def test_publish_failure_answers_503_and_leaves_no_job(make_app, sessions):
    resp = submit(make_app(broker_url=CLOSED_BROKER).test_client())
    assert "queue" in assert_problem(resp, 503)["detail"]
    assert int(resp.headers["Retry-After"]) > 0
    assert job_count(sessions) == 0


def test_database_down_answers_503_and_publishes_nothing(make_app, broker):
    client = make_app(database_url=CLOSED_DB).test_client()
    resp = submit(client)
    assert_problem(resp, 503)
    assert "Retry-After" in resp.headers
    assert broker_messages(broker, "text") == []
    body = resp.get_data(as_text=True)
    assert "127.0.0.1" not in body and "psycopg" not in body


def test_queue_position_follows_priority_then_age(client):
    a = submit(client).get_json()
    b = submit(client, priority="low").get_json()
    c = submit(client, priority="high").get_json()
    positions = {j["id"]: client.get(f"/v1/jobs/{j['id']}").get_json()["queue_position"] for j in (a, b, c)}
    assert positions == {c["id"]: 1, a["id"]: 2, b["id"]: 3}


# --- read -------------------------------------------------------------------------------------


def test_get_returns_the_resource_with_an_etag(client, sessions):
    job = submit(client).get_json()
    resp = client.get(f"/v1/jobs/{job['id']}")
    assert resp.status_code == 200 and resp.get_json()["id"] == job["id"]
    etag = resp.headers["ETag"]
    again = client.get(f"/v1/jobs/{job['id']}", headers={"If-None-Match": etag})
    assert again.status_code == 304 and again.data == b""
    with transaction(sessions) as s:
        assert states.start_text(s, uuid.UUID(job["id"]))
    changed = client.get(f"/v1/jobs/{job['id']}", headers={"If-None-Match": etag})
    assert changed.status_code == 200 and changed.headers["ETag"] != etag
    assert changed.get_json()["status"] == "running"


def test_etag_changes_when_only_the_queue_position_does(client):
    job = submit(client).get_json()
    etag = client.get(f"/v1/jobs/{job['id']}").headers["ETag"]
    submit(client, priority="high")
    resp = client.get(f"/v1/jobs/{job['id']}", headers={"If-None-Match": etag})
    assert resp.status_code == 200 and resp.get_json()["queue_position"] == 2


@pytest.mark.parametrize(
    "job_id", [str(uuid.uuid4()), "not-a-uuid", "1", "00000000-0000-0000-0000-00000000000z"]
)
@pytest.mark.parametrize(
    ("method", "suffix"),
    [("get", ""), ("post", "/cancel"), ("get", "/content"), ("get", "/content?variant=text")],
)
def test_unknown_or_malformed_id_is_404(client, job_id, method, suffix):
    assert_problem(getattr(client, method)(f"/v1/jobs/{job_id}{suffix}"), 404)


# --- list -------------------------------------------------------------------------------------


def test_list_pages_newest_first_with_an_opaque_cursor(client, sessions):
    t0 = datetime(2026, 1, 1, tzinfo=UTC)
    # Two pairs share a created_at: the id breaks the tie, so no job is skipped or repeated.
    times = [t0, t0 + timedelta(seconds=1), t0 + timedelta(seconds=1), t0 + timedelta(seconds=2)] * 2
    jobs = [add_job(sessions, created_at=t + timedelta(minutes=i // 4)) for i, t in enumerate(times)]
    expected = [str(j.id) for j in sorted(jobs, key=lambda j: (j.created_at, j.id), reverse=True)]
    seen, cursor, pages = [], None, 0
    while True:
        resp = client.get("/v1/jobs", query_string={"limit": 3, **({"cursor": cursor} if cursor else {})})
        assert resp.status_code == 200
        page = resp.get_json()
        assert len(page["data"]) <= 3
        seen += [j["id"] for j in page["data"]]
        pages += 1
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == expected and pages == 3


def test_list_default_limit_and_empty(client, sessions):
    assert client.get("/v1/jobs").get_json() == {"data": [], "next_cursor": None}
    for _ in range(21):
        add_job(sessions)
    page = client.get("/v1/jobs").get_json()
    assert len(page["data"]) == 20 and page["next_cursor"]


def test_list_filters_by_status(client, sessions):
    queued = add_job(sessions)
    done = add_job(sessions, status=JobStatus.SUCCEEDED, output_text="t")
    failed = add_job(sessions, status=JobStatus.FAILED, error_code="x")
    ids = lambda q: {j["id"] for j in client.get(f"/v1/jobs?status={q}").get_json()["data"]}  # noqa: E731
    assert ids("queued") == {str(queued.id)}
    assert ids("succeeded,failed") == {str(done.id), str(failed.id)}
    assert ids("canceled") == set()
    assert client.get("/v1/jobs?status=queued").get_json()["data"][0]["queue_position"] == 1


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ("status=done", "status"), ("status=", "status"), ("status=queued,nope", "status"),
        ("limit=0", "limit"), ("limit=101", "limit"), ("limit=ten", "limit"),
        ("cursor=garbage", "cursor"), ("cursor=" + base64.urlsafe_b64encode(b'["x", 1]').decode(), "cursor"),
        ("order=asc", "order"),
    ],
)  # fmt: skip
def test_list_rejects_bad_query(client, query, field):
    problem = assert_problem(client.get(f"/v1/jobs?{query}"), 422)
    assert field in [e["field"] for e in problem["errors"]]


# --- cancel -----------------------------------------------------------------------------------


def test_cancel_is_idempotent_and_revokes_the_stages(app, client, sessions, monkeypatch):
    revoked: list[list[str]] = []
    monkeypatch.setattr(
        app.extensions["genqueue"].celery.control, "revoke", lambda ids, **kw: revoked.append(ids)
    )
    job = submit(client, modality="video").get_json()
    first = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert first.status_code == 200 and first.get_json()["status"] == "canceled"
    assert first.get_json()["error"]["code"] == "canceled"
    assert revoked == [[f"{job['id']}.text", f"{job['id']}.video"]]
    second = client.post(f"/v1/jobs/{job['id']}/cancel")
    assert second.status_code == 200 and second.get_json()["status"] == "canceled"
    assert len(revoked) == 1  # nothing more to revoke
    with sessions() as s:
        events = s.scalars(select(JobEvent.type).where(JobEvent.job_id == uuid.UUID(job["id"]))).all()
    assert events == ["job.canceled"]


def test_cancel_a_running_job(client, sessions):
    job = add_job(sessions, status=JobStatus.RUNNING, stage="video")
    assert client.post(f"/v1/jobs/{job.id}/cancel").get_json()["status"] == "canceled"


@pytest.mark.parametrize("status", [JobStatus.SUCCEEDED, JobStatus.FAILED])
def test_cancel_a_finished_job_is_409(client, sessions, status):
    job = add_job(sessions, status=status)
    problem = assert_problem(client.post(f"/v1/jobs/{job.id}/cancel"), 409)
    assert problem["job_status"] == status and status in problem["detail"]


def test_cancel_survives_a_dead_broker(make_app, sessions):
    job = add_job(sessions)
    resp = make_app(broker_url=CLOSED_BROKER).test_client().post(f"/v1/jobs/{job.id}/cancel")
    assert resp.status_code == 200 and resp.get_json()["status"] == "canceled"


# --- content ----------------------------------------------------------------------------------


def _video_job(sessions, root: Path, thumbnail: bool = True) -> tuple[Job, bytes]:
    job_id = uuid.uuid4()
    data = bytes(range(256)) * 40
    folder = root / str(job_id)
    folder.mkdir(parents=True)
    (folder / "video.mp4").write_bytes(data)
    if thumbnail:
        (folder / "thumbnail.jpg").write_bytes(b"\xff\xd8\xff\xe0fake-jpeg")
    job = add_job(
        sessions, id=job_id, modality="video", status=JobStatus.SUCCEEDED, output_text="a shot",
        artifact_path=f"{job_id}/video.mp4", artifact_bytes=len(data),
    )  # fmt: skip
    return job, data


def test_content_of_a_video_job(client, sessions, settings):
    job, data = _video_job(sessions, Path(settings.artifact_dir))
    resp = client.get(f"/v1/jobs/{job.id}/content?variant=video")
    assert resp.status_code == 200 and resp.mimetype == "video/mp4" and resp.data == data
    assert resp.headers["Accept-Ranges"] == "bytes"
    part = client.get(f"/v1/jobs/{job.id}/content", headers={"Range": "bytes=10-19"})  # default: video
    assert part.status_code == 206 and part.data == data[10:20]
    assert part.headers["Content-Range"] == f"bytes 10-19/{len(data)}"
    cached = client.get(f"/v1/jobs/{job.id}/content", headers={"If-None-Match": resp.headers["ETag"]})
    assert cached.status_code == 304
    thumb = client.get(f"/v1/jobs/{job.id}/content?variant=thumbnail")
    assert thumb.status_code == 200 and thumb.mimetype == "image/jpeg" and thumb.data.startswith(b"\xff\xd8")
    text = client.get(f"/v1/jobs/{job.id}/content?variant=text")
    assert (
        text.status_code == 200 and text.mimetype == "text/plain" and text.get_data(as_text=True) == "a shot"
    )
    listed = client.get(f"/v1/jobs/{job.id}").get_json()["outputs"]
    assert listed["video_url"].endswith(f"/v1/jobs/{job.id}/content?variant=video")


def test_content_missing_thumbnail_is_404(client, sessions, settings):
    job, _ = _video_job(sessions, Path(settings.artifact_dir), thumbnail=False)
    assert_problem(client.get(f"/v1/jobs/{job.id}/content?variant=thumbnail"), 404)


def test_content_path_cannot_leave_the_artifact_dir(client, sessions):
    job = add_job(sessions, modality="video", status=JobStatus.SUCCEEDED, artifact_path="../../../etc/passwd")
    assert_problem(client.get(f"/v1/jobs/{job.id}/content?variant=video"), 404)


def test_content_of_a_text_job(client, sessions):
    job = add_job(sessions, status=JobStatus.SUCCEEDED, output_text="héllo")
    resp = client.get(f"/v1/jobs/{job.id}/content")
    assert resp.status_code == 200 and resp.get_data(as_text=True) == "héllo"
    assert resp.headers["Content-Type"] == "text/plain; charset=utf-8"
    assert_problem(client.get(f"/v1/jobs/{job.id}/content?variant=video"), 404)


@pytest.mark.parametrize("variant", ["video", "text", "thumbnail"])
def test_content_not_ready_is_409(client, variant):
    job = submit(client, modality="video").get_json()
    problem = assert_problem(client.get(f"/v1/jobs/{job['id']}/content?variant={variant}"), 409)
    assert problem["job_status"] == "queued"


@pytest.mark.parametrize("variant", ["audio", "VIDEO", "mp4"])
def test_content_bad_variant_is_422(client, sessions, variant):
    job = add_job(sessions, status=JobStatus.SUCCEEDED, output_text="t")
    problem = assert_problem(client.get(f"/v1/jobs/{job.id}/content?variant={variant}"), 422)
    assert problem["errors"][0]["field"] == "variant"


# --- health -----------------------------------------------------------------------------------


def test_health_and_ready(client):
    assert client.get("/v1/health").get_json() == {"status": "ok"}
    ready = client.get("/v1/ready")
    assert ready.status_code == 200
    body = ready.get_json()
    assert body["status"] == "ready"
    assert body["checks"]["database"]["status"] == body["checks"]["broker"]["status"] == "ok"


@pytest.mark.parametrize(("override", "failed"), [("database_url", "database"), ("broker_url", "broker")])
def test_not_ready_when_a_dependency_is_down(make_app, override, failed):
    dead = {"database_url": CLOSED_DB, "broker_url": CLOSED_BROKER}[override]
    client = make_app(**{override: dead}).test_client()
    assert client.get("/v1/health").status_code == 200  # liveness does not depend on them
    resp = client.get("/v1/ready")
    problem = assert_problem(resp, 503)
    assert int(resp.headers["Retry-After"]) > 0
    assert problem["checks"][failed]["status"] == "fail"
    other = ({"database", "broker"} - {failed}).pop()
    assert problem["checks"][other]["status"] == "ok"
