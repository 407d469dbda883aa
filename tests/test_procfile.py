"""The README's production command as written: real video, image and storyboard jobs (with a variant),
a hot swap, Flower behind basic auth, a graceful stop."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from models.cache import spec_version
from tests.support.api import make_api_key
from tests.support.procs import ROOT, free_port, wait_for

README = ROOT / "README.md"
MARKER = "<!-- the deployment command: tests/test_procfile.py runs this block as written -->"
FLOWER_USER, FLOWER_PASSWORD = "ops", "procfile-test-password"
STOP_TIMEOUT_S = 60
FINISHED = ("succeeded", "failed", "canceled")


def readme_deployment() -> tuple[list[str], str]:
    """(the variables the README's block exports, its command line), from the block after MARKER."""
    block = re.search(re.escape(MARKER) + r"\s*```sh\n(.*?)```", README.read_text(), re.S)
    assert block, f"README.md has no sh block after {MARKER!r}"
    lines = [ln.split("#", 1)[0].strip() for ln in block.group(1).splitlines()]
    exports = [ln.removeprefix("export ").split("=", 1)[0] for ln in lines if ln.startswith("export ")]
    commands = [ln for ln in lines if ln and not ln.startswith("export ")]
    assert len(commands) == 1, commands
    return exports, commands[0]


def test_readme_block_is_found() -> None:
    exports, command = readme_deployment()
    assert "DATABASE_URL" in exports and "GENQUEUE_FLOWER_BASIC_AUTH" in exports
    assert command.startswith("bin/start")


@pytest.fixture
def stack_env(settings, sessions, broker) -> dict[str, str]:
    """The test's own database, Redis db, artifacts and free ports, passed as the README says."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GENQUEUE_", "FLOWER_"))}
    return env | {
        "VIRTUAL_ENV": str(Path(sys.executable).parent.parent),  # bin/start: the active venv
        "PYTHONPATH": str(ROOT),  # this checkout, whichever one the venv was installed from
        "DATABASE_URL": settings.database_url,
        "BROKER_URL": settings.broker_url,
        "GENQUEUE_ARTIFACT_DIR": str(settings.artifact_dir),
        "GENQUEUE_FLOWER_BASIC_AUTH": f"{FLOWER_USER}:{FLOWER_PASSWORD}",
        "GENQUEUE_STOP_TIMEOUT_S": str(STOP_TIMEOUT_S),
        "GENQUEUE_MAX_WAIT_S": "120",
        "HOST": "127.0.0.1",
        "PORT": str(free_port()),
        "WEB_CONCURRENCY": "1",
        "FLOWER_PORT": str(free_port()),
        # Each worker line's own metrics port (free ones: other stacks may run on this host).
        "TEXT_WORKER_METRICS_PORT": str(free_port()),
        "VIDEO_WORKER_METRICS_PORT": str(free_port()),
        "DEFAULT_WORKER_METRICS_PORT": str(free_port()),
        "IMAGE_WORKER_METRICS_PORT": str(free_port()),
        "POST_WORKER_METRICS_PORT": str(free_port()),
        "EXPORTER_PORT": str(free_port()),
    }


def _get(url: str, proc: subprocess.Popen[bytes], **kw: Any) -> httpx.Response | None:
    assert proc.poll() is None, "the stack exited early"
    try:
        return httpx.get(url, timeout=5, **kw)
    except httpx.HTTPError:
        return None


def _video(steps: int) -> dict[str, Any]:
    params = {"width": 128, "height": 128, "num_frames": 9, "steps": steps, "seed": 1}
    return {"prompt": "a paper boat on a river", "modality": "video", "params": params, "cache": False}


IMAGE = {"width": 64, "height": 96, "steps": 2, "seed": 1}
BOARD = {"width": 64, "height": 64, "num_frames": 5, "steps": 2, "seed": 1, "shots": 2, "variants": ["webm"]}


def _submit(web: str, headers: dict[str, str], prompt: str, modality: str, params: dict[str, Any]) -> str:
    body = {"prompt": prompt, "modality": modality, "params": params, "cache": False}
    resp = httpx.post(f"{web}/v1/jobs", json=body, headers=headers, timeout=10)
    assert resp.status_code == 202, resp.text
    return web + resp.headers["Location"]


def _finished(location: str, headers: dict[str, str], variants: bool = False) -> dict[str, Any] | None:
    """The job once finished (and, with `variants`, none of its variants pending)."""
    job: dict[str, Any] = httpx.get(location, headers=headers, timeout=10).json()
    if job["status"] not in FINISHED:
        return None
    pending = variants and any(v["status"] == "pending" for v in (job.get("variants") or {}).values())
    return None if pending else job


def _models_cli(env: dict[str, str], *args: str) -> None:
    cmd = [sys.executable, "-m", "app.cli", "models", *args]
    done = subprocess.run(cmd, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr


def _ran(web: str, headers: dict[str, str], wanted: Callable[[str], bool]) -> dict[str, Any] | None:
    """A new quick video job, once finished, if the version its video stage ran is `wanted`."""
    location = _submit(web, headers, "a paper boat", "video", _video(2)["params"])
    job = wait_for(lambda: _finished(location, headers), 120, 0.2, "the video job")
    return job if wanted(job["models"]["video"]["version"]) else None


@pytest.mark.slow
def test_the_readme_command_runs_a_video_job_and_stops_gracefully(stack_env, sessions, tmp_path) -> None:
    exports, command = readme_deployment()
    assert set(exports) <= stack_env.keys()  # every setting the README names is the test's own
    headers = {"Authorization": f"Bearer {make_api_key(sessions)}"}
    log_path = tmp_path / "stack.log"
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["bash", "-c", command], cwd=ROOT, env=stack_env, stdout=log, stderr=subprocess.STDOUT,
            start_new_session=True,
        )  # fmt: skip
    web, flower = f"http://127.0.0.1:{stack_env['PORT']}", f"http://127.0.0.1:{stack_env['FLOWER_PORT']}"
    try:
        wait_for(lambda: _get(f"{web}/v1/health", proc), 120, 0.3, "web to answer")

        # A video job through the API to completion, on the real default models.
        resp = httpx.post(f"{web}/v1/jobs", json=_video(3), headers=headers, timeout=10)
        assert resp.status_code == 202, resp.text
        location = web + resp.headers["Location"]

        def finished() -> dict[str, Any] | None:
            job: dict[str, Any] = httpx.get(location, headers=headers, timeout=10).json()
            return job if job["status"] in FINISHED else None

        job = wait_for(finished, 300, 0.5, "the video job")
        assert job["status"] == "succeeded", job
        video = httpx.get(web + job["outputs"]["video_url"], headers=headers, timeout=10)
        assert video.status_code == 200 and video.content[4:8] == b"ftyp"

        # Flower: UI and API refuse without credentials, answer with them; it sees the queues.
        auth = (FLOWER_USER, FLOWER_PASSWORD)
        wait_for(lambda: _get(f"{flower}/healthcheck", proc), 60, 0.3, "Flower to answer")
        assert httpx.get(f"{flower}/healthcheck", timeout=10).status_code == 200  # open, by Flower's design
        for path in ("/", "/workers", "/api/workers?refresh=1", "/api/queues/length"):
            assert httpx.get(flower + path, timeout=10).status_code == 401, path
            assert httpx.get(flower + path, auth=(FLOWER_USER, "wrong"), timeout=10).status_code == 401
            assert httpx.get(flower + path, auth=auth, timeout=30).status_code == 200, path

        def queues() -> set[str]:
            lengths = httpx.get(f"{flower}/api/queues/length", auth=auth, timeout=10).json()
            names = {q["name"] for q in lengths.get("active_queues", [])}
            return names if {"text", "video"} <= names else set()

        wait_for(queues, 60, 1, "Flower to see the text and video queues")
        ps = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        assert FLOWER_PASSWORD not in ps  # the credentials travel in the environment, not argv

        # The video worker's /metrics serves what its task threads recorded.
        video_metrics = f"http://127.0.0.1:{stack_env['VIDEO_WORKER_METRICS_PORT']}/metrics"
        scrape = httpx.get(video_metrics, timeout=10).text
        assert 'genqueue_stage_duration_seconds_count{stage="video"} 1.0' in scrape, scrape

        exporter = httpx.get(f"http://127.0.0.1:{stack_env['EXPORTER_PORT']}/metrics", timeout=10).text
        assert 'genqueue_exporter_up{source="broker"} 1.0' in exporter
        assert 'genqueue_exporter_up{source="database"} 1.0' in exporter
        assert 'genqueue_queue_depth{priority="normal",queue="video"} 0.0' in exporter  # drained
        assert 'genqueue_jobs{modality="video",status="queued"} 0.0' in exporter
        web_metrics = httpx.get(f"{web}/metrics", timeout=10).text
        assert 'genqueue_jobs_submitted_total{modality="video"} 1.0' in web_metrics

        # The other modalities on the same stack: an image job on worker_image, a two-shot
        # storyboard (shots and stitch on worker_video) whose WebM variant worker_post makes.
        image = _submit(web, headers, "a red lighthouse", "image", IMAGE)
        board = _submit(web, headers, "A boat leaves. A storm comes.", "storyboard", BOARD)
        image = wait_for(lambda: _finished(image, headers), 300, 0.5, "the image job")
        assert image["status"] == "succeeded", image
        png = httpx.get(web + image["outputs"]["images"][0]["png_url"], headers=headers, timeout=10)
        assert png.status_code == 200 and png.content[:8] == b"\x89PNG\r\n\x1a\n"
        board = wait_for(lambda: _finished(board, headers, variants=True), 300, 0.5, "the storyboard")
        assert board["status"] == "succeeded" and len(board["storyboard"]["shots"]) == 2, board
        film = httpx.get(web + board["outputs"]["video_url"], headers=headers, timeout=10)
        assert film.status_code == 200 and film.content[4:8] == b"ftyp"
        assert board["variants"]["webm"]["status"] == "ready", board["variants"]
        webm = httpx.get(web + board["variants"]["webm"]["url"], headers=headers, timeout=10)
        assert webm.status_code == 200 and webm.content[:4] == b"\x1a\x45\xdf\xa3"  # EBML
        catalog = httpx.get(f"{web}/v1/models", headers=headers, timeout=10).json()["data"]
        warm = {(m["stage"], m["id"]) for m in catalog if m["default"] and m["warm"]}
        assert {"text", "video", "image"} <= {stage for stage, _ in warm}, catalog  # each one loaded

        # A hot swap reaches the running video worker without a restart: wan-tiny's jobs
        # run on the echo weights until the unswap, each recording the version that ran.
        wan_version = job["models"]["video"]["version"]
        _models_cli(stack_env, "swap", "video", "wan-tiny", "echo")
        swapped = wait_for(lambda: _ran(web, headers, lambda v: v != wan_version), 60, 0.2, "the swap")
        ran = swapped["models"]["video"]
        assert (ran["id"], ran["version"]) == ("wan-tiny", spec_version("echo"))
        _models_cli(stack_env, "unswap", "video", "wan-tiny")
        wait_for(lambda: _ran(web, headers, lambda v: v == wan_version), 60, 0.2, "wan-tiny again")

        # Graceful stop: SIGTERM while a job is in its video stage and its submit is held open
        # (Prefer: wait): the worker finishes the task and web answers the held request.
        held: dict[str, Any] = {}

        def submit_and_wait() -> None:
            try:
                held["resp"] = httpx.post(
                    f"{web}/v1/jobs", json=_video(40), headers=headers | {"Prefer": "wait=120"}, timeout=150
                )
            except httpx.HTTPError as exc:
                held["error"] = exc

        submitter = threading.Thread(target=submit_and_wait)
        submitter.start()

        def in_video_stage() -> bool:
            page = httpx.get(f"{web}/v1/jobs?limit=1", headers=headers, timeout=10).json()["data"]
            # Running: the jobs before it finished in their last stage (video) too.
            return bool(page) and page[0]["status"] == "running" and page[0]["stage"] == "video"

        wait_for(in_video_stage, 120, 0.2, "the second job to reach its video stage")
        family = psutil.Process(proc.pid).children(recursive=True)
        assert len(family) >= 9  # every process, gunicorn's worker, the supervised Celery workers
        stopped_at = time.monotonic()
        os.kill(proc.pid, signal.SIGTERM)  # the stack's own pid: it forwards to every process
        rc = proc.wait(timeout=STOP_TIMEOUT_S + 20)
        took = time.monotonic() - stopped_at
        submitter.join(timeout=30)
        log_text = log_path.read_text(errors="replace")
        assert rc == 0, log_text[-4000:]  # 0: everything stopped within the stop timeout, unforced
        assert took < STOP_TIMEOUT_S, took
        assert "error" not in held, held  # web drained it instead of dropping the connection
        assert held["resp"].status_code == 200, held["resp"].text
        assert held["resp"].json()["status"] == "succeeded"  # the worker finished it before exiting
        _, alive = psutil.wait_procs(family, timeout=5)
        assert not [p for p in alive if p.status() != psutil.STATUS_ZOMBIE], alive  # no orphans
        assert "release" in log_text and "stays down" not in log_text
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        for p in psutil.process_iter():  # anything the stack left behind (only on a failure)
            try:
                if p.environ().get("FLOWER_PORT") == stack_env["FLOWER_PORT"]:
                    p.kill()
            except (psutil.Error, OSError):
                pass
