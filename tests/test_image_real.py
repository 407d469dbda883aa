"""Image jobs end to end on the built-in tiny SanaPipeline (random weights): HTTP -> worker -> PNG."""

from __future__ import annotations

import io

import numpy as np
import pytest
from PIL import Image
from sqlalchemy import select

from models import JobEvent
from tests.support.api import wait_finished
from tests.support.workers import thread_workers

pytestmark = pytest.mark.slow

PARAMS = {"width": 96, "height": 64, "steps": 6, "guidance": 3.0, "seed": 1234, "num_images": 2}


def _decode(data: bytes) -> np.ndarray:
    with Image.open(io.BytesIO(data)) as im:
        assert im.format in ("PNG", "WEBP")
        return np.asarray(im.convert("RGB"))


def _job(client, **params):
    body = {"prompt": "a red kite over the sea", "modality": "image", "params": PARAMS | params}
    body["cache"] = False
    resp = client.post("/v1/jobs", json=body)
    assert resp.status_code == 202, resp.get_json()
    return wait_finished(client, resp.get_json()["id"], timeout=240)


def test_the_tiny_sana_renders_the_requested_images_reproducibly(client, settings, sessions) -> None:
    quick = {"progress_interval_s": 0, "webhook_progress_interval_s": 0}  # every step recorded
    with thread_workers(settings, image_model="sana-tiny", **quick):
        first, again = _job(client), _job(client)
        other_seed = _job(client, seed=1235, num_images=1)
    assert first["status"] == again["status"] == other_seed["status"] == "succeeded", first["error"]
    images = first["outputs"]["images"]
    assert len(images) == 2
    pngs = [client.get(i["png_url"]).data for i in images]
    pixels = [_decode(p) for p in pngs]
    assert [p.shape for p in pixels] == [(64, 96, 3)] * 2
    assert not np.array_equal(pixels[0], pixels[1])  # image k comes from seed + k
    assert pixels[0].std() > 0  # noise, not a blank canvas
    for image, png in zip(images, pixels, strict=True):
        assert np.array_equal(_decode(client.get(image["webp_url"]).data), png)  # lossless
    # The same seed gives the same bytes, in another job.
    assert [client.get(i["png_url"]).data for i in again["outputs"]["images"]] == pngs
    assert client.get(other_seed["outputs"]["images"][0]["png_url"]).data != pngs[0]
    # Progress moved with the denoising steps: events between the text stage's 20% and 100%.
    with sessions() as s:
        rows = s.execute(
            select(JobEvent.type, JobEvent.data).where(JobEvent.job_id == first["id"]).order_by(JobEvent.id)
        ).all()
    steps = [d["progress"] for t, d in rows if t == "job.progress" and 20 < d["progress"] < 100]
    assert len(steps) >= 2 and steps == sorted(steps), rows
