"""The event stream of a job the real models run (SmolLM2 + tiny Wan): progress per token, per step."""

from __future__ import annotations

import pytest

from tasks.celery_app import create_celery
from tests.support.api import authed_client_class
from tests.support.workers import in_process_worker
from tests.test_events import frames, stream, submit

pytestmark = pytest.mark.slow


def test_a_17_frame_16_step_video_moves_more_than_0_20_100(settings, sessions, broker, api_key) -> None:
    from app import create_app
    from tasks.lifecycle import preload_models

    # Progress written every 50 ms (not 0.5 s) over 16 steps: on a quiet machine 8 steps took
    # well under a second, and the stream (which sends the latest progress at each wake) then
    # had one or two video steps to show; one made the test flaky.
    real = settings.model_copy(
        update={
            "text_model": "smollm2", "video_model": "wan-tiny", "worker_preload": "text,video",
            "progress_interval_s": 0.05,
        }
    )  # fmt: skip
    flask_app = create_app(real)
    flask_app.test_client_class = authed_client_class(api_key)
    client = flask_app.test_client()
    preload_models(real)
    try:
        with in_process_worker(create_celery(real), concurrency=2, shutdown_timeout=60):
            params = {
                "width": 256,
                "height": 256,
                "num_frames": 17,
                "steps": 16,
                "seed": 7,
                "max_new_tokens": 48,
            }
            jid = submit(client, prompt="a cat dancing on the moon", params=params)
            got = list(frames(stream(client, jid)))
    finally:
        flask_app.extensions["genqueue"].engine.dispose()
    assert got[-1].event == "job.succeeded"
    moved = [f.data["data"]["progress"] for f in got if f.event == "job.progress"]
    assert moved == sorted(moved)
    text, video = [p for p in moved if 0 < p < 20], [p for p in moved if 20 < p < 100]
    assert text and len(video) >= 2, moved  # tokens and denoising steps, not 0 -> 20 -> 100
