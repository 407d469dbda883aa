"""A video job's output variants (WebM, animated WebP preview, upscale) through the API, real
workers (the post queue among them) and Redis, on the zero-cost echo models; each one decoded."""

from __future__ import annotations

import io
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import av
import pytest
from PIL import Image
from pydantic import SecretStr
from sqlalchemy.orm import Session

from models import Job, variants
from models.db import transaction
from models.variants import record, slots
from tasks.contract import names
from tasks.contract.routing import task_routes
from tasks.media import EncodeError
from tests.support.api import assert_problem, submit, wait_finished
from tests.support.jobs import files, get
from tests.support.procs import wait_for
from tests.support.workers import in_process_worker, thread_workers

SMALL = {"width": 96, "height": 64, "num_frames": 9, "fps": 8, "steps": 2}
ALL = ["webm", "preview", "upscale"]


def _video_job(client, **params: Any) -> dict[str, Any]:
    resp = submit(client, prompt="a kite over the dunes", modality="video", params=SMALL | params)
    assert resp.status_code in (200, 202), resp.get_json()
    return dict(resp.get_json())


def _settled(client, job_id: str) -> dict[str, Any]:
    """The job once it finished and none of its variants is pending any more."""
    done = wait_finished(client, job_id)
    assert done["status"] == "succeeded", done["error"]

    def made() -> dict[str, Any] | None:
        body = dict(client.get(f"/v1/jobs/{job_id}").get_json())
        return body if all(v["status"] != "pending" for v in body["variants"].values()) else None

    return wait_for(made, 60)


def _decoded(data: bytes) -> tuple[str, int, int, int]:
    """(codec, width, height, frames) of a video file's first stream."""
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        return stream.codec_context.name, frames[0].width, frames[0].height, len(frames)


def test_a_video_job_gets_each_variant_it_asked_for(make_app, settings, sessions) -> None:
    # Noise frames: a solid-colour clip (echo's) is one still frame to an animated WebP encoder.
    noisy = {"video_model": "tests.support.generators:NoisyVideo"}
    client = make_app(**noisy).test_client()
    with thread_workers(settings, **noisy):
        queued = _video_job(client, variants=ALL)
        assert queued["variants"] == {n: {"status": "pending", "url": None, "signed_url": None,
                                          "bytes": None, "error": None} for n in ALL}  # fmt: skip
        body = _settled(client, queued["id"])
    assert body["params"]["variants"] == ALL and body["params"]["upscale_factor"] == 2
    assert {n: v["status"] for n, v in body["variants"].items()} == dict.fromkeys(ALL, "ready")
    mp4 = client.get(body["outputs"]["video_url"])
    assert _decoded(mp4.data) == ("h264", 96, 64, 9)

    webm = client.get(body["variants"]["webm"]["url"])
    assert (webm.status_code, webm.mimetype) == (200, "video/webm")
    codec, width, height, count = _decoded(webm.data)
    assert codec in ("vp9", "av1", "libdav1d") and (width, height, count) == (96, 64, 9)
    assert body["variants"]["webm"]["bytes"] == len(webm.data)

    preview = client.get(body["variants"]["preview"]["url"])
    assert (preview.status_code, preview.mimetype) == (200, "image/webp")
    with Image.open(io.BytesIO(preview.data)) as im:
        assert im.format == "WEBP" and im.is_animated and 1 < im.n_frames <= 12 and im.width <= 320

    up = client.get(body["variants"]["upscale"]["url"])
    assert (up.status_code, up.mimetype) == (200, "video/mp4")
    assert _decoded(up.data) == ("h264", 192, 128, 9)

    # Beside the MP4 in the job's folder: retention and DELETE remove them with it.
    job = get(sessions, uuid.UUID(body["id"]))
    assert {"video.mp4", "video.webm", "preview.webp", "video-upscaled.mp4"} <= set(
        files(settings.artifact_dir, job.id)
    )
    assert client.delete(f"/v1/jobs/{body['id']}").status_code in (200, 204)
    assert files(settings.artifact_dir, job.id) == []
    assert client.get(f"/v1/jobs/{body['id']}/content?variant=webm").status_code == 410


def test_a_job_without_variants_has_no_variants_key(client, settings, monkeypatch) -> None:
    asked: list[uuid.UUID] = []  # the success's look-up of jobs waiting for variants
    waiting_jobs = variants.waiting_jobs
    monkeypatch.setattr(variants, "waiting_jobs", lambda s, jid: asked.append(jid) or waiting_jobs(s, jid))
    with thread_workers(settings):
        done = wait_finished(client, _video_job(client)["id"])
        seeded = wait_finished(client, _video_job(client, seed=7)["id"])  # a cache key: followers may ask
    assert done["status"] == "succeeded" and "variants" not in done
    assert asked == [uuid.UUID(seeded["id"])]  # none asked, no key: no look-up
    assert "variants" not in done["params"]
    body = assert_problem(client.get(f"/v1/jobs/{done['id']}/content?variant=preview"), 404)
    assert "no preview" in body["detail"]


def test_upscale_by_four(client, settings) -> None:
    with thread_workers(settings):
        body = _settled(client, _video_job(client, variants=["upscale"], upscale_factor=4)["id"])
    assert list(body["variants"]) == ["upscale"]
    assert _decoded(client.get(body["variants"]["upscale"]["url"]).data)[1:] == (384, 256, 9)


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"variants": ["gif"]}, "params.variants"),
        ({"variants": ["webm", "webm"]}, "params.variants"),
        ({"variants": []}, "params.variants"),
        ({"variants": "webm"}, "params.variants"),
        ({"variants": [3]}, "params.variants"),
        ({"variants": ["upscale"], "upscale_factor": 3}, "params.upscale_factor"),
        ({"variants": ["upscale"], "upscale_factor": 4, "width": 1024}, "params.upscale_factor"),
    ],
)
def test_bad_variants_are_422_naming_the_field(client, params, field) -> None:
    body = assert_problem(submit(client, modality="video", params=params), 422)
    assert [e["field"] for e in body["errors"]] == [field]


def test_variants_are_only_for_video_and_storyboard_jobs(client) -> None:
    body = assert_problem(submit(client, modality="image", params={"variants": ["webm"]}), 422)
    message = "only valid for video and storyboard jobs"
    assert body["errors"] == [{"field": "params.variants", "message": message}]


def test_a_pending_variant_is_409_and_a_failed_one_404(client, sessions, broker) -> None:
    job = _video_job(client, variants=["webm", "preview"])  # no worker: it stays queued
    assert_problem(client.get(f"/v1/jobs/{job['id']}/content?variant=webm"), 409)
    jid = uuid.UUID(job["id"])
    with transaction(sessions) as s:
        row = s.get(Job, jid)
        assert row is not None
        row.status, row.artifact_path = "succeeded", names.artifact_key(jid, names.VIDEO_NAME)
    with transaction(sessions) as s:
        assert record(s, jid, "webm", error="EncodeError: boom") == "recorded"
        assert record(s, jid, "webm", key="x", size=1) == "not_pending"  # recorded once
    body = client.get(f"/v1/jobs/{job['id']}").get_json()
    assert body["variants"]["webm"] == {"status": "failed", "url": None, "signed_url": None,
                                        "bytes": None, "error": "EncodeError: boom"}  # fmt: skip
    assert "boom" in assert_problem(client.get(f"/v1/jobs/{job['id']}/content?variant=webm"), 404)["detail"]
    assert_problem(client.get(f"/v1/jobs/{job['id']}/content?variant=preview"), 409)
    with transaction(sessions) as s:  # nothing left pending for the reaper of a later test
        record(s, jid, "preview", error="test over")


def test_variants_go_to_the_post_queue(settings) -> None:
    assert names.POST_QUEUE in names.ALL_QUEUES
    assert task_routes(settings)[names.POSTPROCESS] == {"queue": names.POST_QUEUE}
    assert slots({"variants": ["webm"]}) == {"webm": {"status": "pending"}} and slots({}) is None


def test_a_cached_copy_makes_its_own_variants_with_signed_links(make_app, settings, sessions) -> None:
    app = make_app(media_url_keys=SecretStr("test-key"), public_base_url="http://api.test")
    client = app.test_client()
    with thread_workers(settings):
        first = _settled(client, _video_job(client, seed=5, variants=["preview"])["id"])
        hit = _video_job(client, seed=5, variants=["webm"])  # variants are outside the cache key
        assert (hit["cached"], hit["source_job_id"], hit["status"]) == (True, first["id"], "succeeded")
        copy = _settled(client, hit["id"])
    assert list(copy["variants"]) == ["webm"] and copy["variants"]["webm"]["status"] == "ready"
    link = copy["variants"]["webm"]["signed_url"]
    assert link.startswith(f"http://api.test/v1/media/{copy['id']}/webm?")
    signed = app.test_client().get(link.removeprefix("http://api.test"))
    assert (signed.status_code, signed.mimetype) == (200, "video/webm")
    assert signed.data == client.get(copy["variants"]["webm"]["url"]).data
    assert _decoded(signed.data)[1:] == (96, 64, 9)
    # The copy's file is its own, under its own folder: the source's has only its preview.
    assert "video.webm" in files(settings.artifact_dir, uuid.UUID(copy["id"]))
    assert "video.webm" not in files(settings.artifact_dir, uuid.UUID(first["id"]))


def test_a_failed_variant_never_fails_the_job_and_a_transient_error_retries(
    client, settings, monkeypatch
) -> None:
    from tasks import variants as task

    def broken(*args: Any) -> int:
        raise EncodeError("libvpx-vp9: refused")

    flaky = {"left": 1}
    real = task.MAKERS["preview"]

    def flaky_preview(*args: Any) -> int:
        if flaky["left"]:
            flaky["left"] -= 1
            raise ConnectionError("storage went away")  # transient: the task retries
        return real(*args)

    monkeypatch.setitem(task.MAKERS, "webm", broken)
    monkeypatch.setitem(task.MAKERS, "preview", flaky_preview)
    with thread_workers(settings):
        body = _settled(client, _video_job(client, variants=["webm", "preview"])["id"])
    assert body["status"] == "succeeded" and body["error"] is None
    assert body["variants"]["webm"]["status"] == "failed"
    assert body["variants"]["webm"]["error"] == "EncodeError: libvpx-vp9: refused"
    assert body["variants"]["preview"]["status"] == "ready" and flaky["left"] == 0
    assert client.get(body["variants"]["preview"]["url"]).mimetype == "image/webp"


def test_the_reaper_republishes_a_lost_postprocess_message(client, settings, celery_app, broker) -> None:
    from tasks.maintenance import reap
    from tasks.runtime import runtime

    gpu_only = [q for q in names.ALL_QUEUES if q != names.POST_QUEUE]
    with in_process_worker(celery_app, queues=gpu_only):
        done = wait_finished(client, _video_job(client, variants=["webm"])["id"])
    assert done["status"] == "succeeded" and done["variants"]["webm"]["status"] == "pending"
    lost = list(broker.scan_iter(match=f"{names.POST_QUEUE}*"))
    assert lost and broker.delete(*lost)  # the message is gone, as in a broker outage
    rt = runtime(celery_app)
    assert not reap(rt, celery_app).get("variants_republished")  # none stalled yet
    later = datetime.now(UTC) + timedelta(seconds=settings.variant_stall_s + 1)
    assert reap(rt, celery_app, now=later)["variants_republished"] >= 1  # others may be stalled too
    with in_process_worker(celery_app, queues=[names.POST_QUEUE]):
        body = _settled(client, done["id"])
    assert body["variants"]["webm"]["status"] == "ready"
    with Session(rt.engine) as s:  # nothing left pending for this job: not picked again
        assert uuid.UUID(done["id"]) not in variants.stalled(s, later, settings.variant_stall_s, 500)
