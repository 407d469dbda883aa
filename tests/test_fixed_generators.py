"""bench.fixed_generators (fixed cost per call, each call on record) and bench.busy's arithmetic."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bench import busy
from bench.fixed_generators import (
    INTERVALS_ENV,
    MS_ENV,
    TARGETS,
    FixedImageGenerator,
    FixedTextGenerator,
    FixedVideoGenerator,
    extra_models,
    register,
)
from models import catalog
from models.settings import Settings
from tasks.generators import registry
from tasks.generators.base import ImageRequest, TextRequest, VideoRequest


@pytest.fixture
def registered() -> Iterator[None]:
    register()
    try:
        yield
    finally:
        for kind in TARGETS:
            registry._extra.pop((kind, "fixed"), None)


def test_registered_by_name_and_by_settings(registered: None) -> None:
    assert isinstance(registry._resolve("text", "fixed")(), FixedTextGenerator)
    assert isinstance(registry._resolve("video", "fixed")(), FixedVideoGenerator)
    assert isinstance(registry._resolve("image", "fixed")(), FixedImageGenerator)
    # A worker process knows them from its settings alone: the spec as the stage's model, which
    # extra_models() gives the id `fixed` (jobs may name it), or the spec alone.
    s = Settings(extra_models=extra_models(), video_model=TARGETS["video"], text_model=TARGETS["text"])
    assert catalog.default(s, "video").id == "fixed"
    assert catalog.spec_of(s, "video", None) == catalog.spec_of(s, "video", "fixed") == TARGETS["video"]
    assert catalog.spec_of(s, "image", "fixed") == TARGETS["image"]
    assert catalog.spec_of(Settings(text_model=TARGETS["text"]), "text", None) == TARGETS["text"]
    assert isinstance(registry._resolve("video", TARGETS["video"])(), FixedVideoGenerator)


def test_each_call_takes_the_configured_time_and_is_recorded(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "intervals.jsonl"
    monkeypatch.setenv(MS_ENV, "30")
    monkeypatch.setenv(INTERVALS_ENV, str(log))
    calls = [
        ("text", lambda: FixedTextGenerator().generate([TextRequest("a fox"), TextRequest("a hen")])),
        (
            "video",
            lambda: FixedVideoGenerator().generate(
                [VideoRequest("a fox", width=32, height=32, num_frames=5)]
            ),
        ),
        ("image", lambda: FixedImageGenerator().generate([ImageRequest("a fox", width=64, height=64)])),
    ]
    for _, call in calls:
        started = time.perf_counter()
        results = call()
        assert time.perf_counter() - started >= 0.03
        assert all(r.error is None for r in results)
    text = FixedTextGenerator().generate([TextRequest("a fox")])[0]
    assert text.text == "Shot: a fox"  # echo's output
    video = FixedVideoGenerator().generate([VideoRequest("a fox", width=32, height=16, num_frames=5)])[0]
    assert video.frames.shape == (5, 16, 32, 3)
    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert [r["stage"] for r in lines] == ["text", "video", "image", "text", "video"]
    assert [r["n"] for r in lines[:3]] == [2, 1, 1]
    for r in lines:
        assert r["kind"] == "generate" and r["end"] - r["start"] >= 0.03 and r["pid"] > 0


def test_union_counts_overlaps_once_and_clips_to_the_window() -> None:
    intervals = [(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.2, 3.5)]
    assert busy.union_seconds(intervals, 0.0, 4.0) == pytest.approx(3.0)
    assert busy.union_seconds(intervals, 1.5, 3.5) == pytest.approx(1.0)
    assert busy.busy_fraction(intervals, (0.0, 4.0)) == pytest.approx(0.75)
    assert busy.span(intervals) == (0.0, 4.0)


def test_middle_window_drops_the_first_and_last_calls() -> None:
    # 10 calls of 0.2 s with 0.05 s between them, the first after a slow start, the last after a slow drain.
    calls = [(k * 0.25, k * 0.25 + 0.2) for k in range(10)]
    calls[0] = (-1.0, -0.8)
    calls[-1] = (5.0, 5.2)
    window = busy.middle_window(calls, trim=0.1)
    assert window == (pytest.approx(0.25), pytest.approx(8 * 0.25 + 0.2))
    assert busy.busy_fraction(calls, window) == pytest.approx(8 * 0.2 / (7 * 0.25 + 0.2))
    assert busy.busy_fraction(calls, busy.span(calls)) < busy.busy_fraction(calls, window)


def test_gap_between_calls_is_split_by_task_and_encode_times() -> None:
    records = []
    for k in range(
        3
    ):  # task k: starts at t, generate 10 ms later for 200 ms, encode 20 ms, ends 30 ms after generate
        t = k * 0.25
        records.append({"kind": "task", "name": "genqueue.generate_video", "start": t, "end": t + 0.24})
        records.append({"kind": "generate", "stage": "video", "start": t + 0.01, "end": t + 0.21, "n": 1})
        records.append({"kind": "encode", "start": t + 0.215, "end": t + 0.235})
    parts = busy.gaps(records, "video")
    assert parts == {"gap": 50.0, "finish": 30.0, "encode": 20.0, "handoff": 10.0, "enter": 10.0}


def test_mean_gap() -> None:
    assert busy.mean_gap_ms([(0.3, 0.5), (0.0, 0.2), (0.6, 0.8)]) == pytest.approx(100.0)
