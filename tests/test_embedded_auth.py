"""Embedded mode: a development key is created, printed and kept; limits use in-process memory."""

from __future__ import annotations

from pathlib import Path

from flask.testing import FlaskClient

from app import create_app
from tasks.embedded import DEV_KEY_FILE, embedded_dev_key, embedded_settings, embedded_worker
from tests.support.api import wait_finished


def test_embedded_mode_runs_a_job_with_its_development_key(tmp_path: Path) -> None:
    settings = embedded_settings(tmp_path, text_model="echo", video_model="echo", worker_preload="")
    assert settings.ratelimit_storage_uri == "memory://"
    with embedded_worker(settings):
        key = embedded_dev_key(settings)
        assert key == embedded_dev_key(settings)  # kept beside the database, not re-created
        assert (tmp_path / DEV_KEY_FILE).stat().st_mode & 0o077 == 0  # owner only
        flask_app = create_app(settings)
        anon = FlaskClient(flask_app, flask_app.response_class)
        assert anon.get("/v1/jobs").status_code == 401
        headers = {"Authorization": f"Bearer {key}"}
        resp = anon.post("/v1/jobs", json={"prompt": "a haiku", "modality": "text"}, headers=headers)
        assert resp.status_code == 202 and resp.headers["RateLimit-Limit"]
        job = wait_finished(anon, resp.headers["Location"], 30, headers=headers)
        assert job["status"] == "succeeded" and "a haiku" in job["outputs"]["text"]
        flask_app.extensions["genqueue"].engine.dispose()


def test_demo_authenticates_with_the_development_key(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from app.cli import main

    monkeypatch.setenv("GENQUEUE_TEXT_MODEL", "echo")
    monkeypatch.setenv("GENQUEUE_VIDEO_MODEL", "echo")
    result = CliRunner().invoke(
        main, ["demo", "a fox", "--modality", "text", "--data-dir", str(tmp_path)], catch_exceptions=False
    )
    assert result.exit_code == 0, result.output
    assert "Text:" in result.stdout and "a fox" in result.stdout
    assert (tmp_path / DEV_KEY_FILE).exists()


def test_demo_runs_an_image_job(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from app.cli import main

    monkeypatch.setenv("GENQUEUE_TEXT_MODEL", "echo")
    monkeypatch.setenv("GENQUEUE_IMAGE_MODEL", "echo")
    args = ["demo", "a lighthouse", "--modality", "image", "--data-dir", str(tmp_path)]
    args += ["--param", "num_images=2"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    paths = [line.split(": ", 1)[1] for line in result.stdout.splitlines() if line.startswith("Image: ")]
    assert [Path(p).name for p in paths] == ["image-0.png", "image-1.png"]
    assert all(Path(p).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" for p in paths)


def test_demo_runs_a_storyboard(tmp_path: Path, monkeypatch) -> None:
    from click.testing import CliRunner

    from app.cli import main

    monkeypatch.setenv("GENQUEUE_TEXT_MODEL", "echo")
    monkeypatch.setenv("GENQUEUE_VIDEO_MODEL", "echo")
    args = [
        "demo",
        "A keeper climbs. He lights the lamp.",
        "--modality",
        "storyboard",
        "--data-dir",
        str(tmp_path),
    ]
    args += ["--param", "shots=2", "--param", "num_frames=5", "--param", "width=64", "--param", "height=64"]
    result = CliRunner().invoke(main, args, catch_exceptions=False)
    assert result.exit_code == 0, result.output
    paths = dict(line.split(": ", 1) for line in result.stdout.splitlines() if ": " in line)
    assert Path(paths["Film"]).name == "video.mp4" and Path(paths["Film"]).stat().st_size > 0
    assert Path(paths["Contact sheet"]).read_bytes()[:2] == b"\xff\xd8"  # a JPEG
    assert Path(paths["Shot 0"]).exists() and Path(paths["Shot 1"]).exists()
