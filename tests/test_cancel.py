"""POST /v1/jobs/{id}/cancel in every state, with a real worker: the job stops, compensation runs once."""

from __future__ import annotations

import time
import uuid

from tests.support.generators import Run, runs
from tests.support.jobs import broker_idle, event_rows, events, files, get, wait_until
from tests.support.procs import wait_for
from tests.support.workers import thread_workers

GEN = "tests.support.generators"
VIDEO = {"width": 64, "height": 64, "num_frames": 5, "steps": 40}
TOKENS, STEPS = 400, 100  # far longer than STOP_S uncanceled (0.2 s a token, 0.5 s a step)
STOP_S = 15  # how soon a canceled stage must have stopped and freed its worker


def _submit(client, **body) -> uuid.UUID:
    payload = {"prompt": "a fox in the snow at dusk", "modality": "video"}
    payload["params"] = VIDEO
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


def _stopped(run: Run) -> bool:
    return run.ended is not None


def test_cancel_while_the_text_stage_runs_stops_at_a_token(client, settings, sessions, broker, monkeypatch):
    monkeypatch.setenv("GENQUEUE_TEST_TOKEN_SECONDS", "0.2")
    tag = f"text-{uuid.uuid4().hex[:8]}"
    prompt = " ".join([tag, *(f"w{i}" for i in range(TOKENS - 1))])
    with thread_workers(settings, text_model=f"{GEN}:SlowText"):
        jid = _submit(client, prompt=prompt, params=VIDEO | {"max_new_tokens": TOKENS})  # 80 s uncanceled
        [run] = wait_for(lambda: [r for r in runs(tag) if r.steps >= 3], 60, what="tokens to come out")
        body = _cancel(client, jid).get_json()
        canceled_at = time.monotonic()
        assert (body["status"], body["error"]["stage"]) == ("canceled", "text")
        # Only a working cancel ends the stage this soon: uncanceled it has ~75 s of tokens left.
        wait_for(lambda: _stopped(run), STOP_S, what="the text stage to stop")
        wait_for(lambda: broker_idle(broker), STOP_S, what="the worker to let the message go")
        wait_for(lambda: _compensated(sessions, jid), 30, what="compensation")
    assert run.outcome == "Canceled" and run.steps < TOKENS
    assert run.ended is not None and run.ended - canceled_at < STOP_S
    assert len(runs(tag)) == 1  # not run again after the cancel
    job = get(sessions, jid)
    assert job.status == "canceled" and job.output_text is None
    assert "job.text.completed" not in events(sessions, jid)
    assert files(settings.artifact_dir, jid) == []


def test_cancel_while_the_video_stage_runs_stops_at_a_step(client, settings, sessions, broker, monkeypatch):
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.5")  # 100 steps: ~50 s uncanceled
    tag = f"video-{uuid.uuid4().hex[:8]}"
    with thread_workers(settings, video_model=f"{GEN}:TracedVideo"):
        jid = _submit(client, prompt=f"a fox in the snow {tag}", params=VIDEO | {"steps": STEPS})
        [run] = wait_for(lambda: [r for r in runs(tag) if r.steps >= 3], 60, what="diffusion steps")
        body = _cancel(client, jid).get_json()
        canceled_at, progress_then = time.monotonic(), get(sessions, jid).progress
        assert (body["status"], body["error"]["stage"]) == ("canceled", "video")
        wait_for(lambda: _stopped(run), STOP_S, what="the video stage to stop")
        wait_for(lambda: broker_idle(broker), STOP_S, what="the worker to let the message go")
        wait_for(lambda: _compensated(sessions, jid), 30, what="compensation")
    assert run.outcome == "Canceled" and run.steps < STEPS
    assert run.ended is not None and run.ended - canceled_at < STOP_S
    assert len(runs(tag)) == 1
    job = get(sessions, jid)
    assert job.status == "canceled" and job.artifact_path is None
    assert job.progress == progress_then  # no progress recorded after the cancel
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
