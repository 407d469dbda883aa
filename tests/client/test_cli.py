"""`genqueue run` and `genqueue jobs ...` as a user runs them (subprocesses), against gunicorn and
a real worker: the output file plays, and the exit code says how the job ended."""

from __future__ import annotations

import json
import signal
from pathlib import Path
from unittest.mock import ANY

import av
import httpx
from PIL import Image

import genqueue_client as gq
from tests.support.client import genqueue, spawn
from tests.support.procs import wait_for

VIDEO = ["--param", "width=64", "--param", "height=64", "--param", "num_frames=5", "--param", "steps=4"]


def test_run_writes_a_playable_video(web, api_key, module_worker, tmp_path) -> None:
    out = tmp_path / "fox.mp4"
    done = genqueue(
        web, api_key, "run", "a fox in the snow", "--modality", "video", *VIDEO, "--out", str(out)
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip()  # the shot description the text stage wrote
    assert "stage video" in done.stderr and f"wrote {out}" in done.stderr
    with av.open(str(out)) as container:
        frames = list(container.decode(container.streams.video[0]))
    assert len(frames) == 5 and (frames[0].width, frames[0].height) == (64, 64)


def test_run_names_its_models(web, api_key, module_worker) -> None:
    one = genqueue(web, api_key, "run", "a fox", "--modality", "text", "--model", "echo", "--json")
    assert one.returncode == 0, one.stderr
    assert json.loads(one.stdout)["models"]["text"] == {"asked": "echo", "id": "echo", "version": ANY}
    models = ["--model", "text=echo", "--model", "video=echo"]
    per_stage = genqueue(web, api_key, "run", "a fox", *VIDEO, *models, "--json", "--no-progress")
    assert per_stage.returncode == 0, per_stage.stderr
    assert {s: m["asked"] for s, m in json.loads(per_stage.stdout)["models"].items()} == {
        "text": "echo",
        "video": "echo",
    }
    unknown = genqueue(web, api_key, "run", "a fox", "--model", "video=nope")
    assert unknown.returncode == 4 and "model.video" in unknown.stderr
    assert genqueue(web, api_key, "run", "a fox", "--model", "echo", "--model", "text=echo").returncode == 2


def test_run_writes_an_image_jobs_first_png(web, api_key, module_worker, tmp_path) -> None:
    out = tmp_path / "boat.png"
    sizes = ["--param", "width=64", "--param", "height=96", "--param", "num_images=2", "--param", "steps=2"]
    done = genqueue(web, api_key, "run", "a boat at dawn", "--modality", "image", *sizes, "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "stage image" in done.stderr and f"wrote {out}" in done.stderr
    with Image.open(out) as image:
        assert (image.format, image.size) == ("PNG", (64, 96))


def test_run_exits_1_when_the_job_fails(web, api_key, module_worker) -> None:
    done = genqueue(web, api_key, "run", "poison [[fail]]", "--modality", "text")
    assert done.returncode == 1, done.stderr
    assert "failed: invalid_request" in done.stderr


def test_run_exits_3_when_the_job_is_canceled(web, api_key, module_worker, monkeypatch) -> None:
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.2")  # the in-process worker: 20 s of steps
    proc = spawn(web, api_key, "run", "a slow fox", *VIDEO, "--param", "steps=100", "--json")
    with gq.Client(web, api_key) as client:
        job = wait_for(lambda: next(client.list(status="running"), None), 30, 0.1, "the job to run")
        client.cancel(job.id)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 3, stderr
    assert json.loads(stdout)["status"] == "canceled"


def test_run_timeout_usage_and_transport_errors_have_their_own_codes(
    web, api_key, module_worker, monkeypatch
) -> None:
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.2")
    late = genqueue(web, api_key, "run", "a slow fox", *VIDEO, "--param", "steps=100", "--timeout", "1")
    assert late.returncode == 6 and "it goes on" in late.stderr
    with gq.Client(web, api_key) as client:  # it does: stop it
        [job] = client.list()
        assert not job.finished
        client.cancel(job.id)
    assert genqueue(web, api_key, "run", "a fox", "--param", "width").returncode == 2
    unreachable = genqueue("http://127.0.0.1:9", api_key, "jobs", "list")
    assert unreachable.returncode == 5 and "cannot reach the server" in unreachable.stderr
    refused = genqueue(web, "gq_nope1234_" + "x" * 43, "jobs", "list")
    assert refused.returncode == 4 and "[unauthorized]" in refused.stderr


def test_jobs_commands(web, api_key, module_worker, tmp_path: Path) -> None:
    with gq.Client(web, api_key) as client:
        job = client.wait(
            client.submit("a fox", "video", params={"width": 64, "height": 64, "num_frames": 5}).id
        )
    listed = genqueue(web, api_key, "jobs", "list", "--json")
    assert listed.returncode == 0 and json.loads(listed.stdout.splitlines()[0])["id"] == job.id
    got = genqueue(web, api_key, "jobs", "get", job.id)
    assert got.returncode == 0 and json.loads(got.stdout)["status"] == "succeeded"
    events = genqueue(web, api_key, "jobs", "events", job.id)
    assert [json.loads(line)["type"] for line in events.stdout.splitlines()][-1] == "job.succeeded"
    out = tmp_path / "clip.mp4"
    out.write_bytes(b"")
    fetched = genqueue(web, api_key, "jobs", "download", job.id, "--out", str(out))
    content = httpx.get(f"{web}{job.outputs['video_url']}", headers={"Authorization": f"Bearer {api_key}"})
    assert fetched.returncode == 0 and out.read_bytes() == content.content
    conflict = genqueue(web, api_key, "jobs", "cancel", job.id)
    assert conflict.returncode == 4 and "[conflict]" in conflict.stderr
    assert genqueue(web, api_key, "jobs", "delete", job.id).returncode == 0
    gone = genqueue(web, api_key, "jobs", "download", job.id, "--out", str(tmp_path / "x.mp4"))
    assert gone.returncode == 4 and "[data-removed]" in gone.stderr


def test_an_interrupted_run_exits_130_and_leaves_the_job(web, api_key, module_worker, monkeypatch) -> None:
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.2")
    proc = spawn(web, api_key, "run", "a slow fox", *VIDEO, "--param", "steps=100")
    with gq.Client(web, api_key) as client:
        job = wait_for(lambda: next(client.list(status="running"), None), 30, 0.1, "the job to run")
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 130, stderr
        assert b"goes on" in stderr and client.get(job.id).status == "running"
        client.cancel(job.id)
