"""Image jobs through the API and a real worker, on the zero-cost echo image adapter."""

from __future__ import annotations

import io
import uuid

import pytest
from PIL import Image
from pydantic import SecretStr

from tests.support.api import assert_problem, submit, wait_finished
from tests.support.generators import TracedImage, runs
from tests.support.jobs import broker_idle, broker_messages, event_rows, events, files, get
from tests.support.procs import wait_for
from tests.support.workers import in_process_worker, thread_workers

GEN = "tests.support.generators"
SMALL = {"width": 64, "height": 96, "steps": 3, "seed": 11}


def _image_job(client, prompt: str = "a lighthouse at dusk", **params):
    return submit(client, prompt=prompt, modality="image", params=SMALL | params)


def _pixels(data: bytes) -> tuple[str, tuple[int, int], bytes]:
    with Image.open(io.BytesIO(data)) as im:
        return im.format or "", im.size, im.convert("RGB").tobytes()


def test_an_image_job_renders_each_image_as_png_and_webp(client, settings, sessions) -> None:
    with thread_workers(settings):
        resp = _image_job(client, num_images=3)
        assert resp.status_code == 202, resp.get_json()
        queued = resp.get_json()
        done = wait_finished(client, queued["id"])
    assert done["status"] == "succeeded", done["error"]
    assert (done["modality"], done["stage"], done["progress"]) == ("image", "image", 100)
    params = done["params"]
    assert params | SMALL == params and params["num_images"] == 3 and params["enhance_prompt"] is True
    assert done["outputs"]["text"].startswith("Shot:")  # the text stage ran (echo)
    images = done["outputs"]["images"]
    assert [i["index"] for i in images] == [0, 1, 2] and done["outputs"]["video_url"] is None
    seen = []
    for image in images:
        png, webp = client.get(image["png_url"]), client.get(image["webp_url"])
        assert (png.status_code, png.mimetype, webp.mimetype) == (200, "image/png", "image/webp")
        p, w = _pixels(png.data), _pixels(webp.data)
        assert (p[0], p[1], w[0], w[1]) == ("PNG", (64, 96), "WEBP", (64, 96))
        assert p[2] == w[2]  # lossless WebP: the same pixels
        seen.append(p[2])
    assert len(set(seen)) == 3  # image k is drawn from seed + k
    thumb = client.get(done["outputs"]["thumbnail_url"])
    assert thumb.mimetype == "image/jpeg" and _pixels(thumb.data)[1] == (64, 96)
    job = get(sessions, uuid.UUID(done["id"]))
    assert job.images_rendered == 3 and job.image_s is not None and job.image_model == "echo"
    assert job.video_s is None and job.frames_rendered is None
    names = files(settings.artifact_dir, job.id)
    assert sorted(names) == sorted(
        ["thumbnail.jpg", *[f"image-{k}.{fmt}" for k in range(3) for fmt in ("png", "webp")]]
    )


def test_enhance_prompt_false_sends_the_prompt_as_written(client, settings, sessions) -> None:
    with thread_workers(settings):
        done = wait_finished(client, _image_job(client, enhance_prompt=False).get_json()["id"])
    assert done["status"] == "succeeded" and done["outputs"]["text"] == "a lighthouse at dusk"
    job = get(sessions, uuid.UUID(done["id"]))
    assert job.tokens_generated == 0 and job.text_gpu_s is None and job.text_model is None


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"width": 100}, "params.width"),  # not a multiple of 32
        ({"height": 4096}, "params.height"),
        ({"width": 32}, "params.width"),
        ({"num_images": 5}, "params.num_images"),
        ({"num_images": 0}, "params.num_images"),
        ({"steps": 0}, "params.steps"),
        ({"guidance": -1}, "params.guidance"),
        ({"num_frames": 5}, "params.num_frames"),
        ({"enhance_prompt": "no"}, "params.enhance_prompt"),
    ],
)
def test_bad_image_params_are_422_naming_the_field(client, params, field) -> None:
    body = assert_problem(submit(client, modality="image", params=params), 422)
    assert [e["field"] for e in body["errors"]] == [field]


def test_params_of_another_modality_are_named(client) -> None:
    body = assert_problem(submit(client, modality="image", params={"num_frames": 5}), 422)
    assert body["errors"][0]["message"] == "only valid for video and storyboard jobs"
    body = assert_problem(submit(client, modality="video", params={"num_images": 2}), 422)
    assert body["errors"][0]["message"] == "only valid for image jobs"
    body = assert_problem(submit(client, modality="text", params={"width": 64}), 422)
    assert body["errors"][0]["message"] == "only valid for video, image and storyboard jobs"
    body = assert_problem(submit(client, modality="audio"), 422)
    assert body["errors"] == [
        {"field": "modality", "message": "must be one of: text, video, image, storyboard"}
    ]


def test_the_plan_bounds_image_sizes(tenant_client) -> None:
    small = tenant_client("small-images", max_width=128)
    body = assert_problem(_image_job(small, width=256), 403)
    assert [e["field"] for e in body["errors"]] == ["params.width"]


def test_content_names_a_bad_index_or_format(client, settings) -> None:
    with thread_workers(settings):
        done = wait_finished(client, _image_job(client, num_images=2).get_json()["id"])
    content = f"/v1/jobs/{done['id']}/content"
    assert client.get(content).mimetype == "image/png"  # the default variant of an image job
    assert client.get(f"{content}?variant=image&index=1&format=webp").mimetype == "image/webp"
    for query, field in (("index=x", "index"), ("index=-1", "index"), ("format=gif", "format")):
        body = assert_problem(client.get(f"{content}?variant=image&{query}"), 422)
        assert [e["field"] for e in body["errors"]] == [field]
    assert_problem(client.get(f"{content}?variant=image&index=2"), 404)  # two images: 0 and 1
    assert_problem(client.get(f"{content}?variant=video"), 404)


def test_signed_links_serve_each_image(make_app, settings) -> None:
    app = make_app(media_url_keys=SecretStr("test-key"), public_base_url="http://api.test")
    client = app.test_client()
    with thread_workers(settings):
        done = wait_finished(client, _image_job(client, num_images=2).get_json()["id"])
    outputs = done["outputs"]
    assert outputs["thumbnail_signed_url"] and outputs["signed_urls_expire_at"]
    for image in outputs["images"]:
        for fmt in ("png", "webp"):
            link = image[f"{fmt}_signed_url"]
            assert link.startswith(f"http://api.test/v1/media/{done['id']}/image-{image['index']}.{fmt}?")
            anon = app.test_client()
            signed = anon.get(link.removeprefix("http://api.test"))
            assert (signed.status_code, signed.mimetype) == (200, f"image/{fmt}")
            assert signed.data == client.get(image[f"{fmt}_url"]).data
    forged = outputs["images"][0]["png_signed_url"].removeprefix("http://api.test")
    assert_problem(app.test_client().get(forged.replace("image-0", "image-1")), 403)


def test_an_identical_image_request_is_a_cache_hit(client, settings, broker) -> None:
    with thread_workers(settings):
        first = wait_finished(client, _image_job(client, num_images=2).get_json()["id"])
    broker.flushdb()
    hit = _image_job(client, num_images=2)  # no worker now: a hit never reaches a queue
    assert hit.status_code == 200
    body = hit.get_json()
    assert (body["cached"], body["source_job_id"], body["status"]) == (True, first["id"], "succeeded")
    assert len(body["outputs"]["images"]) == 2 and broker_idle(broker)
    for mine, theirs in zip(body["outputs"]["images"], first["outputs"]["images"], strict=True):
        assert client.get(mine["png_url"]).data == client.get(theirs["png_url"]).data
    assert _image_job(client, num_images=2, seed=12).status_code == 202  # another seed computes


def test_identical_image_jobs_attach_to_the_running_one(client, celery_app, broker) -> None:
    leader = _image_job(client, num_images=2, seed=21).get_json()
    follower = _image_job(client, num_images=2, seed=21).get_json()
    assert (follower["status"], follower["cached"]) == ("queued", True)
    assert follower["source_job_id"] == leader["id"]
    assert len(broker_messages(broker, "text")) == 1  # one computation queued, not two
    with in_process_worker(celery_app, concurrency=2):
        done = wait_finished(client, leader["id"])
        copy = wait_finished(client, follower["id"])
    assert (done["status"], copy["status"], copy["cached"]) == ("succeeded", "succeeded", True)
    for mine, theirs in zip(copy["outputs"]["images"], done["outputs"]["images"], strict=True):
        assert client.get(mine["webp_url"]).data == client.get(theirs["webp_url"]).data


def test_cancel_during_the_image_stage_removes_its_files(client, settings, sessions, broker, monkeypatch):
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.3")
    tag = f"image-{uuid.uuid4().hex[:8]}"
    with thread_workers(settings, image_model=f"{GEN}:TracedImage"):
        jid = uuid.UUID(_image_job(client, prompt=f"a lighthouse {tag}", steps=100).get_json()["id"])
        [run] = wait_for(lambda: [r for r in runs(tag) if r.steps >= 2], 60, what="image steps")
        body = client.post(f"/v1/jobs/{jid}/cancel").get_json()
        assert (body["status"], body["error"]["stage"]) == ("canceled", "image")
        wait_for(lambda: run.outcome is not None, 15, what="the image stage to stop")
        wait_for(lambda: broker_idle(broker), 15, what="the worker to let the message go")
        wait_for(lambda: "job.compensated" in events(sessions, jid), 30, what="compensation")
    assert run.outcome == "Canceled" and run.steps < 100
    job = get(sessions, jid)
    assert job.status == "canceled" and job.artifact_path is None
    assert files(settings.artifact_dir, jid) == []
    assert len(event_rows(sessions, jid, "job.compensated")) == 1


def test_delete_removes_a_finished_image_jobs_files(client, settings, sessions) -> None:
    with thread_workers(settings):
        done = wait_finished(client, _image_job(client, num_images=2, seed=99).get_json()["id"])
    jid = uuid.UUID(done["id"])
    assert len(files(settings.artifact_dir, jid)) == 5
    assert client.delete(f"/v1/jobs/{jid}").status_code == 204
    assert files(settings.artifact_dir, jid) == []
    assert_problem(client.get(done["outputs"]["images"][0]["png_url"]), 410)


def test_same_shaped_image_jobs_share_one_model_call(client, settings, sessions) -> None:
    TracedImage.calls.clear()
    with thread_workers(settings, image_model=f"{GEN}:TracedImage", image_batch_max_wait_ms=2000):
        posted = [_image_job(client, prompt=f"a boat, take {k}", num_images=1 + k % 2) for k in range(4)]
        ids = [p.get_json()["id"] for p in posted]
        jobs = [wait_finished(client, jid) for jid in ids]
    assert all(j["status"] == "succeeded" for j in jobs)
    assert sum(TracedImage.calls) == 4 and max(TracedImage.calls) > 1  # one call, several jobs
    assert [len(j["outputs"]["images"]) for j in jobs] == [1, 2, 1, 2]


def test_an_out_of_memory_image_retries_degraded(client, settings, sessions, monkeypatch) -> None:
    monkeypatch.setenv("GENQUEUE_TEST_MAX_PIXELS", str(64 * 64))
    with thread_workers(settings, image_model=f"{GEN}:SizeLimitedImage"):
        resp = _image_job(client, width=128, height=128, allow_degraded=True)
        done = wait_finished(client, resp.get_json()["id"])
    assert done["status"] == "succeeded", done["error"]
    assert done["degraded"]["reason"] == "out_of_memory"
    assert done["degraded"]["to"] | {"model": None} == {"width": 64, "height": 64, "steps": 2, "model": None}
    png = client.get(done["outputs"]["images"][0]["png_url"])
    assert _pixels(png.data)[1] == (64, 64)
