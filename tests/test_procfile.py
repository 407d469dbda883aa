"""The Procfile's processes (honcho) run a real video job on Postgres and Redis; Flower and the exporter
see the queues."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.slow
ROOT = Path(__file__).resolve().parent.parent
PROCESSES = ["web", "worker_text", "worker_video", "worker_default", "flower", "exporter"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_http(url: str, timeout: float, proc: subprocess.Popen) -> httpx.Response:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "honcho exited early"
        try:
            return httpx.get(url, timeout=2)
        except httpx.HTTPError:
            time.sleep(0.3)
    raise AssertionError(f"{url} never answered")


@pytest.fixture
def procfile_env(settings, sessions, broker, tmp_path) -> dict[str, str]:
    bindir = str(Path(sys.executable).parent)  # the venv's genqueue, gunicorn, celery
    return os.environ | {
        "PATH": f"{bindir}:{os.environ['PATH']}",
        "PYTHONPATH": str(ROOT),
        "DATABASE_URL": settings.database_url,
        "BROKER_URL": settings.broker_url,
        "GENQUEUE_ARTIFACT_DIR": str(settings.artifact_dir),
        "WEB_CONCURRENCY": "1",
        "FLOWER_PORT": str(_free_port()),
        "EXPORTER_PORT": str(_free_port()),
        "FLOWER_UNAUTHENTICATED_API": "true",
        "HF_HUB_OFFLINE": "1",
        "PYTHONUNBUFFERED": "1",
    }


def test_procfile_runs_a_video_job(procfile_env, tmp_path) -> None:
    env = procfile_env
    release = subprocess.run(
        [sys.executable, "-m", "honcho", "start", "release"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert release.returncode == 0, release.stdout + release.stderr
    created = subprocess.run(
        ["genqueue", "keys", "create", "--tenant", "procfile"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert created.returncode == 0, created.stderr
    headers = {"Authorization": f"Bearer {created.stdout.strip()}"}
    base_port = _free_port()
    log = (tmp_path / "honcho.log").open("w")
    proc = subprocess.Popen(
        [sys.executable, "-m", "honcho", "start", "-p", str(base_port), *PROCESSES],
        cwd=ROOT,
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    web = f"http://127.0.0.1:{base_port}"  # honcho gives the first process the base port
    try:
        assert _wait_http(f"{web}/v1/health", 90, proc).status_code == 200
        body = {
            "prompt": "a paper boat on a river",
            "modality": "video",
            "params": {"width": 128, "height": 128, "num_frames": 9, "steps": 3, "seed": 1},
        }
        resp = httpx.post(f"{web}/v1/jobs", json=body, headers=headers, timeout=10)
        assert resp.status_code == 202, resp.text
        location = web + resp.headers["Location"]
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            job = httpx.get(location, headers=headers, timeout=10).json()
            if job["status"] in ("succeeded", "failed", "canceled"):
                break
            time.sleep(0.5)
        assert job["status"] == "succeeded", job
        video = httpx.get(web + job["outputs"]["video_url"], headers=headers, timeout=10)
        assert video.status_code == 200 and video.content[4:8] == b"ftyp"

        flower = f"http://127.0.0.1:{env['FLOWER_PORT']}"
        _wait_http(f"{flower}/healthcheck", 60, proc)
        deadline = time.monotonic() + 60
        names: set[str] = set()
        while time.monotonic() < deadline and not {"text", "video"} <= names:
            lengths = httpx.get(f"{flower}/api/queues/length", timeout=10)
            if lengths.status_code == 200:
                names = {q["name"] for q in lengths.json().get("active_queues", [])}
            time.sleep(1)
        assert {"text", "video"} <= names, names

        exporter = _wait_http(f"http://127.0.0.1:{env['EXPORTER_PORT']}/metrics", 60, proc).text
        assert 'genqueue_exporter_up{source="broker"} 1.0' in exporter
        assert 'genqueue_exporter_up{source="database"} 1.0' in exporter
        assert 'genqueue_queue_depth{priority="normal",queue="video"} 0.0' in exporter  # drained
        assert 'genqueue_jobs{modality="video",status="queued"} 0.0' in exporter
        web_metrics = httpx.get(f"{web}/metrics", timeout=10).text
        assert 'genqueue_jobs_submitted_total{modality="video"} 1.0' in web_metrics
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
        log.close()
