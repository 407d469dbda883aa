"""Storyboards through the API and real workers: a shot list, parallel shots, one stitched film."""

from __future__ import annotations

import io
import uuid
from datetime import timedelta

import av
import numpy as np
import pytest
from PIL import Image
from sqlalchemy import update

from models import Job, JobStatus, shot_states
from models.base import utcnow
from models.db import transaction
from models.job_shots import JobShot, ShotStatus
from tasks.contract import names
from tasks.maintenance import reap
from tasks.media import encode_mp4
from tasks.runtime import runtime
from tests.support.api import assert_problem, submit, wait_finished
from tests.support.jobs import broker_idle, create_job, event_rows, events, files, get, wait_done
from tests.support.procs import wait_for
from tests.support.workers import thread_workers

SMALL = {"width": 64, "height": 64, "num_frames": 5, "fps": 6, "steps": 2, "seed": 7}
PROMPT = "A lighthouse keeper climbs the stairs. He lights the lamp. A ship turns away from the rocks."


def _storyboard(client, shots: int = 3, **params):
    return submit(client, prompt=PROMPT, modality="storyboard", params=SMALL | {"shots": shots} | params)


def _probe(data: bytes) -> tuple[int, int, int, float]:
    """(frames, width, height, duration in seconds) of an MP4, decoded."""
    with av.open(io.BytesIO(data)) as c:
        stream = c.streams.video[0]
        frames = sum(1 for _ in c.decode(video=0))
        return frames, stream.width, stream.height, frames / float(stream.average_rate or 1)


def _shots(sessions, jid: uuid.UUID) -> list[JobShot]:
    with sessions() as s:
        return shot_states.of_job(s, jid)


def test_a_storyboard_renders_its_shots_and_stitches_one_film(client, settings, sessions) -> None:
    with thread_workers(settings):
        resp = _storyboard(client, shots=3)
        assert resp.status_code == 202, resp.get_json()
        done = wait_finished(client, resp.get_json()["id"], timeout=90)
    assert done["status"] == "succeeded", done["error"]
    assert (done["modality"], done["stage"], done["progress"]) == ("storyboard", "stitch", 100)
    assert done["params"]["shots"] == 3 and done["params"]["enhance_prompt"] is True
    board = done["storyboard"]
    assert board["title"] and board["parsed"] in ("json", "repaired", "split")
    shots = board["shots"]
    assert [s["index"] for s in shots] == [0, 1, 2]
    assert all(s["status"] == "succeeded" and s["progress"] == 100 and s["attempts"] == 1 for s in shots)
    assert all(s["description"] and s["frames"] == SMALL["num_frames"] for s in shots)
    # The film: every shot's frames, in order, at the job's size and frame rate.
    film = client.get(done["outputs"]["video_url"])
    assert (film.status_code, film.mimetype) == (200, "video/mp4")
    frames, width, height, duration = _probe(film.data)
    assert (frames, width, height) == (3 * SMALL["num_frames"], 64, 64)
    assert duration == pytest.approx(3 * SMALL["num_frames"] / SMALL["fps"], abs=0.01)
    for shot in shots:  # each clip downloads on its own
        clip = client.get(shot["video_url"])
        assert clip.status_code == 200 and _probe(clip.data)[0] == SMALL["num_frames"]
    sheet = client.get(board["contact_sheet_url"])
    assert sheet.mimetype == "image/jpeg"
    with Image.open(io.BytesIO(sheet.data)) as im:
        assert im.format == "JPEG" and im.width >= 3 * 64 // 2
    jid = uuid.UUID(done["id"])
    assert sorted(files(settings.artifact_dir, jid)) == sorted(
        ["video.mp4", "thumbnail.jpg", "contact-sheet.jpg", *[names.shot_name(i) for i in range(3)]]
    )
    completed = event_rows(sessions, jid, "job.shot.completed")
    assert sorted(e.data["shot"] for e in completed) == [0, 1, 2]
    assert [e.data["shots_completed"] for e in completed] == [1, 2, 3]
    assert events(sessions, jid)[-1] == "job.succeeded"
    job = get(sessions, jid)
    assert job.frames_rendered == 3 * SMALL["num_frames"] and job.video_model == "echo"
    assert job.video_gpu_s is not None and job.video_gpu_s > 0


def test_shots_get_their_own_seeds_and_the_prompt_split_as_written(client, settings, sessions) -> None:
    """enhance_prompt false: the prompt's sentences are the shots, no text model runs."""
    with thread_workers(settings):
        done = wait_finished(client, _storyboard(client, shots=3, enhance_prompt=False).get_json()["id"], 90)
    assert done["status"] == "succeeded", done["error"]
    shots = done["storyboard"]["shots"]
    assert [s["description"] for s in shots] == [
        "A lighthouse keeper climbs the stairs.", "He lights the lamp.", "A ship turns away from the rocks.",
    ]  # fmt: skip
    clips = [client.get(s["video_url"]).data for s in shots]
    firsts = []
    for clip in clips:
        with av.open(io.BytesIO(clip)) as c:
            firsts.append(next(iter(c.decode(video=0))).to_ndarray(format="rgb24").mean(axis=(0, 1)))
    assert len({tuple(np.round(f)) for f in firsts}) == 3  # three prompts, three seeds: three looks


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"shots": 1}, "params.shots"),
        ({"shots": 13}, "params.shots"),
        ({"num_images": 2}, "params.num_images"),
    ],
)
def test_bad_storyboard_params_are_422_naming_the_field(client, sessions, params, field) -> None:
    body = assert_problem(_storyboard(client, **params), 422)
    assert field in [e["field"] for e in body["errors"]], body
    with sessions() as s:
        assert s.query(Job).count() == 0  # nothing written


def _overdue(sessions, jid: uuid.UUID, **values) -> None:
    with transaction(sessions) as s:
        s.execute(
            update(Job).where(Job.id == jid).values(deadline_at=utcnow() - timedelta(seconds=1), **values)
        )


def _storyboard_row(settings, sessions, shots: int, rendered: int) -> uuid.UUID:
    """A storyboard whose text stage is done and whose first `rendered` shots have their files."""
    jid = create_job(sessions, "storyboard", PROMPT, **SMALL, shots=shots)
    with transaction(sessions) as s:
        shot_states.create(s, jid, [f"shot {i} of a lighthouse" for i in range(shots)])
    from models.storage import open_storage

    storage = open_storage(settings)
    for i in range(rendered):
        key = names.artifact_key(jid, names.shot_name(i))
        frames = np.full((SMALL["num_frames"], 64, 64, 3), 40 * (i + 1), dtype=np.uint8)
        with storage.writing(key, "video/mp4") as path:
            size = encode_mp4(frames, SMALL["fps"], str(path))["bytes"]
        with transaction(sessions) as s:
            s.execute(
                update(JobShot)
                .where(JobShot.job_id == jid, JobShot.idx == i)
                .values(
                    status=ShotStatus.SUCCEEDED,
                    progress=100,
                    attempts=1,
                    artifact_path=key,
                    artifact_bytes=size,
                    frames=SMALL["num_frames"],
                    seconds=0.1,
                )
            )
    stage = "stitch" if rendered == shots else "shots"
    with transaction(sessions) as s:
        s.execute(
            update(Job)
            .where(Job.id == jid)
            .values(
                status=JobStatus.RUNNING,
                stage=stage,
                output_text='{"title": "t", "shots": []}',
                attempts=1,
                published_at=utcnow(),
                started_at=utcnow(),
            )
        )
    return jid


def test_a_stitch_whose_message_was_lost_is_sent_again_by_the_reaper(settings, sessions, broker) -> None:
    """Every shot rendered and the job moved to its stitch, but the worker died before sending
    it (a chord whose callback was lost): past the deadline the reaper sends it again."""
    jid = _storyboard_row(settings, sessions, shots=2, rendered=2)
    _overdue(sessions, jid)
    with thread_workers(settings) as app:
        assert reap(runtime(app), app) == {"requeued_overdue": 1}
        job = wait_done(sessions, jid, timeout=60)
    assert job.status == "succeeded", (job.error_code, job.error_message)
    assert job.recoveries == 1 and job.frames_rendered == 2 * SMALL["num_frames"]
    assert "video.mp4" in files(settings.artifact_dir, jid)


def test_a_lost_fan_out_sends_only_the_unfinished_shots(settings, sessions, broker) -> None:
    """Shot 0 rendered, shots 1 and 2 lost with their messages: the reaper's resend of the fan-out
    renders those two only, and the film has all three."""
    jid = _storyboard_row(settings, sessions, shots=3, rendered=1)
    _overdue(sessions, jid)
    with thread_workers(settings) as app:
        assert reap(runtime(app), app) == {"requeued_overdue": 1}
        job = wait_done(sessions, jid, timeout=60)
    assert job.status == "succeeded", (job.error_code, job.error_message)
    shots = _shots(sessions, jid)
    assert [s.attempts for s in shots] == [1, 1, 1] and all(s.status == "succeeded" for s in shots)
    assert len(event_rows(sessions, jid, "job.shot.completed")) == 2  # shot 0 was done before


def test_a_duplicated_shot_message_renders_nothing_twice(client, settings, sessions, broker) -> None:
    with thread_workers(settings) as app:
        done = wait_finished(client, _storyboard(client, shots=2).get_json()["id"], timeout=90)
        jid = done["id"]
        app.send_task(names.RENDER_SHOT, args=(jid, 0), task_id=names.shot_task_id(jid, 0))
        app.send_task(names.STITCH_SHOTS, args=(jid,), task_id=f"{jid}.stitch-dup")
        wait_for(lambda: broker_idle(broker), 30, what="the duplicates consumed")
    jid_ = uuid.UUID(jid)
    assert len(event_rows(sessions, jid_, "job.shot.completed")) == 2
    assert events(sessions, jid_).count("job.succeeded") == 1
    assert [s.attempts for s in _shots(sessions, jid_)] == [1, 1]


def test_a_storyboard_film_gets_its_asked_variants(client, settings, sessions) -> None:
    """params.variants on a storyboard: made from the stitched film, as a video job's are."""
    with thread_workers(settings):
        jid = _storyboard(client, shots=2, variants=["preview"]).get_json()["id"]
        wait_finished(client, jid, timeout=90)

        def made() -> dict | None:
            job = client.get(f"/v1/jobs/{jid}").get_json()
            return job if job["variants"]["preview"]["status"] != "pending" else None

        ready = wait_for(made, 60, what="the preview")
    preview = ready["variants"]["preview"]
    assert preview["status"] == "ready", preview
    with Image.open(io.BytesIO(client.get(preview["url"]).data)) as im:
        assert im.format == "WEBP" and getattr(im, "n_frames", 1) > 1


def test_cancel_stops_the_running_shots_and_removes_every_shot_file(
    client, settings, sessions, broker, monkeypatch
) -> None:
    """Cancel while shots render: the running ones stop at a step, the queued ones never run,
    compensation removes every file (a rendered shot's too), once."""
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.2")  # 40 steps a shot: ~8 s uncanceled
    with thread_workers(settings):
        jid = _storyboard(client, shots=6, steps=40).get_json()["id"]
        uid = uuid.UUID(jid)

        def rendering() -> bool:
            return any(s.status == "running" and s.progress > 5 for s in _shots(sessions, uid))

        wait_for(rendering, 60, what="a shot mid-render")
        body = client.post(f"/v1/jobs/{jid}/cancel").get_json()
        assert (body["status"], body["error"]["stage"]) == ("canceled", "shots")
        wait_for(lambda: broker_idle(broker), 30, what="the shots to stop or be dropped")
        wait_for(lambda: "job.compensated" in events(sessions, uid), 30, what="compensation")
        shots = client.get(f"/v1/jobs/{jid}").get_json()["storyboard"]["shots"]
    assert all(s["status"] in ("canceled", "succeeded") for s in shots)
    assert sum(s["status"] == "canceled" for s in shots) >= 1
    assert files(settings.artifact_dir, uid) == []
    assert len(event_rows(sessions, uid, "job.compensated")) == 1
    assert "job.succeeded" not in events(sessions, uid)
