"""`genqueue run` with the real default models (SmolLM2 + the tiny Wan pipeline) behind gunicorn."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import av
import pytest

from tests.support.client import genqueue

pytestmark = pytest.mark.slow


@pytest.fixture
def real_worker(settings, sessions) -> Iterator[Any]:
    from tasks.celery_app import create_celery
    from tasks.lifecycle import preload_models
    from tests.support.workers import in_process_worker

    real = settings.model_copy(
        update={"text_model": "smollm2", "video_model": "wan-tiny", "worker_preload": "text,video"}
    )
    app = create_celery(real, set_as_current=False)
    preload_models(real)  # what a worker does once per process
    with in_process_worker(app, concurrency=1, shutdown_timeout=60):
        yield app


def test_run_with_the_real_models_writes_a_playable_mp4(web, api_key, real_worker, tmp_path) -> None:
    out = tmp_path / "cat.mp4"
    params = ["width=256", "height=256", "num_frames=17", "fps=8", "steps=4", "seed=7"]
    args = [arg for p in params for arg in ("--param", p)]
    done = genqueue(web, api_key, "run", "a cat dancing on the moon", *args, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.split()) >= 3  # SmolLM2 wrote a shot description
    with av.open(str(out)) as container:
        stream = container.streams.video[0]
        frames = list(container.decode(stream))
    assert stream.codec_context.name == "h264" and len(frames) == 17
    assert (stream.width, stream.height) == (256, 256)
