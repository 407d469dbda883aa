"""Headers of real server answers (gunicorn, werkzeug's `genqueue serve` server): one Date each.

werkzeug's make_conditional (send_file, the job's ETag) set a Date in the app; gunicorn drops an
app's Date for its own, but werkzeug's server (http.server's send_response) sent both."""

from __future__ import annotations

import socket
import threading
import uuid
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from werkzeug.serving import make_server

from models import Job, JobStatus
from models.db import transaction
from tests.support.procs import gunicorn_web


def _raw_headers(base: str, path: str, auth: str = "") -> list[tuple[str, str]]:
    """The header lines exactly as sent (httpx would fold repeated ones together)."""
    url = urlsplit(base)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        extra = f"Authorization: Bearer {auth}\r\n" if auth else ""
        sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n{extra}Connection: close\r\n\r\n".encode())
        data = b""
        while b"\r\n\r\n" not in data and (chunk := sock.recv(65536)):
            data += chunk
    head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")[1:]
    return [(k.strip(), v.strip()) for k, _, v in (line.partition(":") for line in head)]


PATHS = (
    "/v1/jobs/{id}/content",  # send_file
    "/v1/jobs/{id}/content?variant=text",
    "/v1/jobs/{id}",  # the job's ETag
    "/v1/jobs/not-a-job",  # problem+json
    "/v1/health",
)


def _video_job(settings, sessions) -> uuid.UUID:
    job_id = uuid.uuid4()
    folder = Path(settings.artifact_dir) / str(job_id)
    folder.mkdir(parents=True)
    (folder / "video.mp4").write_bytes(b"\0" * 4096)
    job = Job(
        id=job_id, modality="video", status=JobStatus.SUCCEEDED, prompt="p", params={}, priority="normal",
        progress=100, attempts=1, recoveries=0, cached=False, output_text="t",
        artifact_path=f"{job_id}/video.mp4", artifact_bytes=4096,
    )  # fmt: skip
    with transaction(sessions) as s:
        s.add(job)
    return job_id


def _assert_one_date(base: str, job_id: uuid.UUID, api_key: str) -> None:
    for path in PATHS:
        headers = _raw_headers(base, path.format(id=job_id), api_key)
        dates = [v for k, v in headers if k.lower() == "date"]
        assert len(dates) == 1 and dates[0].endswith(" GMT"), (path, headers)


def test_the_development_server_sends_one_date(app, settings, sessions, api_key) -> None:
    job_id = _video_job(settings, sessions)
    server = make_server("127.0.0.1", 0, app, threaded=True)  # what `genqueue serve` runs
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        _assert_one_date(f"http://127.0.0.1:{server.server_port}", job_id, api_key)
    finally:
        server.shutdown()


@pytest.mark.slow
def test_gunicorn_sends_one_date(settings, sessions, broker, api_key, tmp_path: Path) -> None:
    job_id = _video_job(settings, sessions)
    with gunicorn_web(settings, tmp_path / "gunicorn.log") as base:
        _assert_one_date(base, job_id, api_key)
