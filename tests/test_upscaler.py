"""The `upscale` variant through a configured diffusers upscaler folder (the tiny random x4 build,
saved as real weights would be), on a real worker; and the adapter's own guarantees."""

from __future__ import annotations

import io

import av
import numpy as np
import pytest

from tasks.variant_media import upscale_frames
from tests.support.api import submit, wait_finished
from tests.support.procs import wait_for
from tests.support.workers import thread_workers

NOISY = {"video_model": "tests.support.generators:NoisyVideo"}
SMALL = {"width": 64, "height": 64, "num_frames": 5, "fps": 8, "steps": 2}


@pytest.fixture(scope="module")
def upscaler_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    from tasks.generators.upscaler import build_tiny_upscaler

    path = tmp_path_factory.mktemp("x4-upscaler-tiny")
    build_tiny_upscaler().save_pretrained(path)
    assert (path / "model_index.json").exists()
    return str(path)


def _frames(data: bytes) -> np.ndarray:
    with av.open(io.BytesIO(data)) as container:
        return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])


def test_the_configured_upscaler_renders_the_variant(make_app, settings, upscaler_dir) -> None:
    model = {"upscale_model_dir": upscaler_dir, "upscale_steps": 2}
    client = make_app(**NOISY).test_client()
    with thread_workers(settings, **NOISY, **model):
        resp = submit(client, prompt="a kite", modality="video", params=SMALL | {"variants": ["upscale"]})
        done = wait_finished(client, resp.get_json()["id"])
        assert done["status"] == "succeeded", done["error"]

        def made() -> dict | None:
            body = client.get(f"/v1/jobs/{done['id']}").get_json()
            return body if body["variants"]["upscale"]["status"] != "pending" else None

        body = wait_for(made, 90)
    assert body["variants"]["upscale"]["status"] == "ready", body["variants"]
    source = _frames(client.get(body["outputs"]["video_url"]).data)
    upscaled = _frames(client.get(body["variants"]["upscale"]["url"]).data)
    assert upscaled.shape == (5, 128, 128, 3)  # x4 by the model, then to the asked x2
    # Not the Lanczos fallback: the random-weight model's output is far from a resampled copy.
    lanczos = upscale_frames(source, 2)
    assert np.abs(upscaled.astype(int) - lanczos.astype(int)).mean() > 20


def test_the_upscaler_is_deterministic_and_keeps_every_frame(upscaler_dir) -> None:
    from tasks.generators import upscaler

    frames = np.random.default_rng(1).integers(0, 256, (6, 32, 48, 3), dtype=np.uint8)
    first = upscaler.upscale(frames, "a kite", upscaler_dir, steps=2)
    assert first.shape == (6, 128, 192, 3) and first.dtype == np.uint8  # 6 frames over two calls
    again = upscaler.upscale(frames, "a kite", upscaler_dir, steps=2)
    assert np.array_equal(first, again)  # a redelivery writes the same file
