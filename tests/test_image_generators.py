"""The image adapters: the contract's rules, echo, the tiny SanaPipeline and a saved pipeline folder."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from models import catalog
from models.storage import LocalStorage
from tasks.artifacts import write_images
from tasks.generators import registry
from tasks.generators.base import Canceled, ImageRequest, InvalidRequest
from tasks.generators.echo import EchoImageGenerator


def test_echo_images_follow_the_seed_and_the_size() -> None:
    gen = EchoImageGenerator()
    [two] = gen.generate([ImageRequest("a boat", width=64, height=32, steps=2, seed=3, num_images=2)])
    [one] = gen.generate([ImageRequest("a boat", width=64, height=32, steps=2, seed=4)])
    assert two.error is None and two.images.shape == (2, 32, 64, 3) and two.images.dtype == np.uint8
    assert np.array_equal(two.images[1], one.images[0])  # image k comes from seed + k
    assert not np.array_equal(two.images[0], two.images[1])


def test_the_contract_refuses_bad_image_requests() -> None:
    gen = EchoImageGenerator()
    bad = [
        ImageRequest("x", width=48),  # not on the 32 grid
        ImageRequest("x", height=0),
        ImageRequest("x", steps=0),
        ImageRequest("x", num_images=5),
        ImageRequest("x", guidance_scale=float("nan")),
        ImageRequest(" "),
    ]
    out = gen.generate(bad, on_step=lambda *a: pytest.fail("nothing should run"))
    assert all(isinstance(r.error, InvalidRequest) for r in out)
    assert "multiple of 32" in str(out[0].error) and "num_images" in str(out[3].error)


def test_the_catalog_side_multiple_is_the_image_adapters_own() -> None:
    for known in (e for e in catalog.BUILTIN if e.stage == "image"):
        gen = registry.get_generator("image", known.name)
        side = known.side_multiple or 0
        assert gen.spatial_multiple == side == registry.side_multiple(known.name, "image"), known
        assert gen.generate([ImageRequest("x", width=side, height=side, steps=1)])[0].error is None
        off = gen.generate([ImageRequest("x", width=side + side // 2, height=side, steps=1)])
        assert isinstance(off[0].error, InvalidRequest), known


def test_write_images_writes_png_webp_and_a_thumbnail(tmp_path: Path) -> None:
    images = np.random.default_rng(0).integers(0, 255, (2, 32, 48, 3), dtype=np.uint8)
    jid = uuid.uuid4()
    folder = tmp_path / str(jid)
    key, size = write_images(LocalStorage(tmp_path), jid, images)
    assert key == f"{jid}/image-0.png"
    names = sorted(p.name for p in folder.iterdir())
    assert names == ["image-0.png", "image-0.webp", "image-1.png", "image-1.webp", "thumbnail.jpg"]
    assert size == sum((folder / n).stat().st_size for n in names if n.startswith("image"))
    for k in range(2):
        for fmt in ("png", "webp"):
            with Image.open(folder / f"image-{k}.{fmt}") as im:
                assert np.array_equal(np.asarray(im.convert("RGB")), images[k])  # lossless both
    first = (folder / "image-0.png").read_bytes()
    write_images(LocalStorage(tmp_path), jid, images)  # a redelivery rewrites the same bytes
    assert (folder / "image-0.png").read_bytes() == first


# -- the tiny SanaPipeline (random weights, about a second per call on a CPU) ----------------------
@pytest.fixture(scope="module")
def tiny_sana() -> Iterator[object]:
    from tasks.generators.sana import TinySanaGenerator

    gen = TinySanaGenerator()
    gen.load()
    yield gen


def test_tiny_sana_shapes_steps_and_seed(tiny_sana) -> None:
    steps: list[tuple[int, int, int]] = []
    req = ImageRequest("a red kite", width=64, height=96, steps=3, seed=5, num_images=2, guidance_scale=2.0)
    [out] = tiny_sana.generate([req], on_step=lambda *a: steps.append(a))
    assert out.error is None and out.images.shape == (2, 96, 64, 3) and out.images.dtype == np.uint8
    assert steps == [(0, 1, 3), (0, 2, 3), (0, 3, 3)]
    assert out.extra == {"seed": 5, "batch": 2}
    assert np.array_equal(tiny_sana.generate([req])[0].images, out.images)  # same seed, same pixels
    assert not np.array_equal(out.images[0], out.images[1])


def test_tiny_sana_batches_same_shape_requests_as_rows(tiny_sana) -> None:
    reqs = [
        ImageRequest("a", width=32, height=32, steps=2, seed=1, num_images=2),
        ImageRequest("b", width=32, height=32, steps=2, seed=9, num_images=1),
        ImageRequest("c", width=64, height=32, steps=2, seed=1),  # another shape: its own call
    ]
    out = tiny_sana.generate(reqs)
    assert [r.extra["batch"] for r in out] == [3, 3, 1]
    assert [r.images.shape[0] for r in out] == [2, 1, 1]
    alone = tiny_sana.generate([ImageRequest("b", width=32, height=32, steps=2, seed=9)])[0]
    assert np.abs(alone.images.astype(int) - out[1].images.astype(int)).max() <= 2  # rounding only


def test_tiny_sana_cancel(tiny_sana) -> None:
    steps: list[tuple[int, int, int]] = []
    calls: list[int] = []

    def cancel() -> bool:  # one check before the run, then one per step
        calls.append(1)
        return len(calls) >= 3

    with pytest.raises(Canceled):
        tiny_sana.generate(
            [ImageRequest("x", width=32, height=32, steps=8)],
            on_step=lambda *a: steps.append(a),
            should_cancel=cancel,
        )
    assert len(steps) == 2


def test_a_saved_sana_folder_loads_through_the_folder_adapter(tmp_path: Path) -> None:
    """What real weights go through: a diffusers folder, DiffusionPipeline.from_pretrained, local only."""
    from tasks.generators.diffusers_image import DiffusersImageGenerator
    from tasks.generators.sana import build_tiny_sana

    build_tiny_sana().save_pretrained(tmp_path)
    gen = registry._resolve("image", str(tmp_path))()
    assert isinstance(gen, DiffusersImageGenerator)
    gen.load()
    assert gen.spatial_multiple == 32 and gen.version.startswith(tmp_path.name + "@")
    [out] = gen.generate([ImageRequest("x", width=64, height=32, steps=2, seed=0, num_images=2)])
    assert out.error is None and out.images.shape == (2, 32, 64, 3)


def test_the_image_instruction_is_no_longer_than_the_one_the_api_counts() -> None:
    """The API counts a prompt's tokens under SYSTEM_PROMPT (app/prompt_check.py); an image job's
    text stage renders it under IMAGE_SYSTEM_PROMPT, which must not make it longer."""
    from tasks.contract.prompt_limit import IMAGE_SYSTEM_PROMPT, SYSTEM_PROMPT

    assert len(IMAGE_SYSTEM_PROMPT.encode()) <= len(SYSTEM_PROMPT.encode())
