"""POST /v1/jobs/{id}/cancel in every state, with a real worker: the job stops, compensation runs once."""

from __future__ import annotations

import uuid

from tests.support.jobs import broker_idle, event_rows, events, files, get, thread_workers, wait_until
from tests.support.procs import wait_for

GEN = "tests.support.generators"


def _submit(client, **body) -> uuid.UUID:
    payload = {"prompt": "a fox in the snow at dusk", "modality": "video"}
    payload["params"] = {"width": 64, "height": 64, "num_frames": 5, "steps": 40}
    resp = client.post("/v1/jobs", json=payload | body)
    assert resp.status_code == 202, resp.get_json()
    return uuid.UUID(resp.get_json()["id"])


def _cancel(client, jid: uuid.UUID):
    return client.post(f"/v1/jobs/{jid}/cancel")


def _compensated(sessions, jid) -> bool:
    return "job.compensated" in events(sessions, jid)


def test_a_canceled_queued_job_never_starts(client, settings, sessions, broker):
    jid = _submit(client)
    first, again = _cancel(client, jid), _cancel(client, jid)
    assert first.status_code == again.status_code == 200
    assert first.get_json()["status"] == again.get_json()["status"] == "canceled"
    with thread_workers(settings):  # the job's messages are still queued when a worker arrives
        wait_for(lambda: _compensated(sessions, jid), 60, what="compensation")
        wait_for(lambda: broker_idle(broker), 30, what="the queue to drain")
    job = get(sessions, jid)
    assert (job.status, job.started_at, job.attempts, job.error_code) == ("canceled", None, 0, "canceled")
    assert events(sessions, jid) == ["job.canceled", "job.compensated"]


def test_cancel_while_the_text_stage_runs_stops_at_a_token(client, settings, sessions, broker, monkeypatch):
    monkeypatch.setenv("GENQUEUE_TEST_TOKEN_SECONDS", "0.2")
    with thread_workers(settings, text_model=f"{GEN}:SlowText"):
        jid = _submit(client, prompt=" ".join(f"word{i}" for i in range(200)))  # ~40 s uncanceled
        wait_until(sessions, jid, lambda j: j.status == "running", 60, "running")
        body = _cancel(client, jid).get_json()
        assert (body["status"], body["error"]["stage"]) == ("canceled", "text")
        wait_for(lambda: _compensated(sessions, jid), 30, what="compensation")
        wait_for(lambda: broker_idle(broker), 30, what="the stage to stop")
    job = get(sessions, jid)
    assert job.status == "canceled" and job.output_text is None
    assert "job.text.completed" not in events(sessions, jid)
    assert files(settings.artifact_dir, jid) == []


def test_cancel_while_the_video_stage_runs_stops_at_a_step(client, settings, sessions, broker, monkeypatch):
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.25")  # 40 steps: ~10 s uncanceled
    with thread_workers(settings):
        jid = _submit(client)
        wait_until(sessions, jid, lambda j: j.stage == "video" and j.progress > 20, 60, "video progress")
        body = _cancel(client, jid).get_json()
        assert (body["status"], body["error"]["stage"]) == ("canceled", "video")
        wait_for(lambda: broker_idle(broker), 30, what="the stage to stop")
        wait_for(lambda: _compensated(sessions, jid), 30, what="compensation")
    job = get(sessions, jid)
    assert job.status == "canceled" and job.progress < 95 and job.artifact_path is None
    assert files(settings.artifact_dir, jid) == []
    assert len(event_rows(sessions, jid, "job.compensated")) == 1
    assert events(sessions, jid).count("job.canceled") == 1


def test_cancel_a_finished_job_is_409_and_keeps_it(client, settings, sessions, broker):
    with thread_workers(settings):
        jid = _submit(client, params={"width": 64, "height": 64, "num_frames": 5, "steps": 2})
        wait_until(sessions, jid, lambda j: j.status == "succeeded", 60, "success")
    resp = _cancel(client, jid)
    assert resp.status_code == 409 and resp.get_json()["job_status"] == "succeeded"
    assert get(sessions, jid).status == "succeeded"
    assert files(settings.artifact_dir, jid) == ["thumbnail.jpg", "video.mp4"]
    assert "job.compensated" not in events(sessions, jid)
