"""genqueue_client against a real server: gunicorn (the production config), Postgres, Redis and a
real Celery worker (threads pool, in this process) on the echo models."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import genqueue_client as gq
from genqueue_client import client as client_module
from tests.support.api import make_api_key
from tests.support.procs import gunicorn_web, wait_for
from tests.support.workers import thread_workers

VIDEO = {"width": 64, "height": 64, "num_frames": 5, "steps": 4}


@pytest.fixture(scope="module")
def web(settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The production web server for the module; each test's `sessions` empties its tables."""
    with gunicorn_web(settings, tmp_path_factory.mktemp("web") / "gunicorn.log") as base:
        yield base


@pytest.fixture(scope="module")
def worker(settings) -> Iterator[Any]:
    """One real worker for the module (no test flushes the broker under it)."""
    with thread_workers(settings) as app:
        yield app


@pytest.fixture
def gqc(web, api_key) -> Iterator[gq.Client]:
    with gq.Client(web, api_key, backoff_s=0.05) as c:
        yield c


def test_submit_wait_download_matches_the_content_endpoint(gqc, worker, web, api_key, tmp_path) -> None:
    job = gqc.submit("a fox in the snow", "video", params=VIDEO)
    assert job.status in ("queued", "running", "succeeded")
    seen: list[gq.Event] = []
    done = gqc.wait(job.id, on_event=seen.append, timeout=60)
    assert done.status == "succeeded" and done.text
    assert [e.type for e in seen if e.id is not None][-1] == "job.succeeded"
    out = gqc.download(job.id, tmp_path / "fox.mp4")
    direct = httpx.get(f"{web}/v1/jobs/{job.id}/content", headers={"Authorization": f"Bearer {api_key}"})
    assert direct.status_code == 200 and out.read_bytes() == direct.content
    # a partial file is continued with Range: the same bytes
    partial = tmp_path / "partial.mp4"
    partial.write_bytes(direct.content[: len(direct.content) // 3])
    assert gqc.download(job.id, partial).read_bytes() == direct.content
    assert gqc.download(job.id, partial).read_bytes() == direct.content  # already whole: 416, kept
