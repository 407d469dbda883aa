"""The storyboard stitch: shot MP4s joined in order, the contact sheet, the probe."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from tasks.media import encode_mp4
from tasks.stitch import _frames, contact_sheet, probe_mp4, stitch_mp4

COLOURS = [(220, 30, 30), (30, 200, 40), (40, 50, 210)]
COUNTS = [5, 7, 9]
FPS = 8


def _clip(path: Path, colour: tuple[int, int, int], count: int, size: tuple[int, int] = (64, 64)) -> str:
    frames = np.empty((count, size[1], size[0], 3), np.uint8)
    frames[:] = colour
    encode_mp4(frames, FPS, str(path))
    return str(path)


@pytest.fixture
def shots(tmp_path: Path) -> list[str]:
    return [
        _clip(tmp_path / f"shot{i}.mp4", c, n) for i, (c, n) in enumerate(zip(COLOURS, COUNTS, strict=True))
    ]


def test_stitch_joins_shots_in_order(tmp_path: Path, shots: list[str]) -> None:
    out = tmp_path / "story.mp4"
    info = stitch_mp4(shots, str(out), FPS)
    assert info == {"frames": 21, "bytes": out.stat().st_size, "width": 64, "height": 64}
    probe = probe_mp4(str(out))
    assert (probe["frames"], probe["width"], probe["height"]) == (21, 64, 64)
    assert probe["fps"] == pytest.approx(FPS)
    assert probe["duration_s"] == pytest.approx(21 / FPS, abs=0.01)
    decoded = list(_frames(str(out)))
    starts = [0, 5, 12]
    for start, count, colour in zip(starts, COUNTS, COLOURS, strict=True):
        for index in (start, start + count - 1):  # each segment's first and last frame
            mean = decoded[index].reshape(-1, 3).mean(axis=0)
            assert np.abs(mean - colour).max() < 12, (index, mean, colour)
    assert sorted(os.listdir(tmp_path)) == ["shot0.mp4", "shot1.mp4", "shot2.mp4", "story.mp4"]
    with open(out, "rb") as f:
        assert f.read(64).index(b"moov") < 64  # the shared encoder's +faststart


def test_stitch_refuses_mismatched_size_and_writes_nothing(tmp_path: Path, shots: list[str]) -> None:
    odd = _clip(tmp_path / "wide.mp4", (9, 9, 9), 3, size=(96, 64))
    with pytest.raises(ValueError, match="96x64"):
        stitch_mp4([*shots[:2], odd], str(tmp_path / "story.mp4"), FPS)
    assert not [name for name in os.listdir(tmp_path) if name.startswith("story")]
    with pytest.raises(ValueError):
        stitch_mp4([], str(tmp_path / "story.mp4"), FPS)


def test_stitch_refuses_a_shot_without_frames(
    tmp_path: Path, shots: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # FFmpeg writes no MP4 at all without a frame, so the decoder is what yields none here.
    from tasks import stitch

    decode = stitch._frames
    monkeypatch.setattr(stitch, "_frames", lambda p: iter(()) if p == "empty.mp4" else decode(p))
    with pytest.raises(ValueError, match="no frames"):
        stitch_mp4([shots[0], "empty.mp4"], str(tmp_path / "story.mp4"), FPS)
    assert not (tmp_path / "story.mp4").exists()


def test_contact_sheet_has_one_tile_per_shot(tmp_path: Path, shots: list[str]) -> None:
    from PIL import Image

    out = tmp_path / "sheet.jpg"
    info = contact_sheet(shots, str(out), tile_width=32)
    assert info == {"bytes": out.stat().st_size, "width": 96, "height": 32}
    with Image.open(out) as sheet:
        assert sheet.format == "JPEG"
        assert sheet.size == (96, 32)
        pixels = np.asarray(sheet.convert("RGB"))
    for index, colour in enumerate(COLOURS):
        centre = pixels[16, index * 32 + 16].astype(int)
        assert np.abs(centre - colour).max() < 20, (index, centre, colour)


def test_contact_sheet_wraps_after_four(tmp_path: Path, shots: list[str]) -> None:
    info = contact_sheet(shots * 2, str(tmp_path / "sheet.jpg"), tile_width=16)
    assert (info["width"], info["height"]) == (64, 32)  # 4 + 2 tiles: two rows
