"""End to end with the real default models: HTTP -> Postgres -> real worker -> SmolLM2 + tiny Wan -> MP4."""

from __future__ import annotations

import io

import av
import pytest

from tasks.celery_app import create_celery
from tests.support.api import authed_client_class, wait_finished
from tests.support.workers import in_process_worker

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def real_settings(settings):
    return settings.model_copy(
        update={"text_model": "smollm2", "video_model": "wan-tiny", "worker_preload": "text,video"}
    )


@pytest.fixture
def real_client(real_settings, sessions, broker, api_key):
    from app import create_app

    flask_app = create_app(real_settings)
    flask_app.test_client_class = authed_client_class(api_key)
    return flask_app.test_client()


@pytest.fixture
def real_worker(real_settings, sessions, broker):
    from tasks.lifecycle import preload_models

    app = create_celery(real_settings)
    preload_models(real_settings)  # what a worker does once per process
    with in_process_worker(app, concurrency=2, shutdown_timeout=60):
        yield app


def test_video_job_with_real_models_returns_playable_mp4(real_worker, real_client) -> None:
    params = {"width": 256, "height": 256, "num_frames": 17, "fps": 8, "steps": 4, "seed": 7}
    resp = real_client.post(
        "/v1/jobs", json={"prompt": "a cat dancing on the moon", "modality": "video", "params": params}
    )
    assert resp.status_code == 202, resp.get_data(as_text=True)
    job = wait_finished(real_client, resp.headers["Location"], 240, interval=0.1)
    assert job["status"] == "succeeded", job["error"]
    text = job["outputs"]["text"]
    assert isinstance(text, str) and len(text.split()) >= 3, text  # SmolLM2 wrote a shot description
    assert job["timings"]["text_s"] > 0 and job["timings"]["video_s"] > 0

    video = real_client.get(job["outputs"]["video_url"])
    assert video.status_code == 200 and video.mimetype == "video/mp4"
    body = video.get_data()
    with av.open(io.BytesIO(body)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
        assert stream.codec_context.name == "h264"
        assert (stream.width, stream.height) == (256, 256)
        assert len(frames) == 17
        assert float(stream.average_rate) == pytest.approx(8, rel=0.01)

    part = real_client.get(job["outputs"]["video_url"], headers={"Range": "bytes=100-1099"})
    assert part.status_code == 206
    assert part.headers["Content-Range"] == f"bytes 100-1099/{len(body)}"
    assert part.get_data() == body[100:1100]

    text_resp = real_client.get(job["outputs"]["text_url"])
    assert text_resp.status_code == 200 and text_resp.get_data(as_text=True) == text


def test_text_job_with_real_smollm2(real_worker, real_client) -> None:
    resp = real_client.post(
        "/v1/jobs",
        json={
            "prompt": "Describe a lighthouse at dawn",
            "modality": "text",
            "params": {"max_new_tokens": 24},
        },
    )
    assert resp.status_code == 202
    job = wait_finished(real_client, resp.headers["Location"], 240, interval=0.1)
    assert job["status"] == "succeeded" and job["outputs"]["text"].strip()
    assert job["outputs"]["video_url"] is None
