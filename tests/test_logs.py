"""Logs: one JSON object per line with the request and job context, X-Request-Id in and out."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from app.request_id import HEADER
from models import logs
from models.db import read_only
from models.job import Job
from tasks.contract.names import stage_task_id
from tests.support.api import assert_problem, submit, wait_finished
from tests.support.procs import ROOT, Worker, gunicorn_web, wait_for, worker_env

GENERATED = re.compile(r"[0-9a-f]{32}")
CELERY_OWN_WRITES = (
    "SecurityWarning: You're running the worker with superuser", "absolutely not recommended",
    "--uid option", "User information: uid=0", "_warn_or_raise_security_error", "worker: Warm shutdown",
)  # fmt: skip


class Lines:
    """The JSON lines the process's root logger writes while the fixture is active."""

    def __init__(self) -> None:
        self.stream = io.StringIO()
        self.handler = logging.StreamHandler(self.stream)
        self.handler.setFormatter(logs.JsonLines())
        self.handler.addFilter(logs.ContextFilter())

    def all(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.stream.getvalue().splitlines()]

    def matching(self, message: str) -> list[dict[str, Any]]:
        return [line for line in self.all() if message in line["message"]]


@pytest.fixture
def lines() -> Iterator[Lines]:
    captured = Lines()
    root = logging.getLogger()
    old_level = root.level
    root.addHandler(captured.handler)
    root.setLevel(logging.INFO)
    yield captured
    root.removeHandler(captured.handler)
    root.setLevel(old_level)


def _tenant_of(sessions, job_id: str) -> str:
    with read_only(sessions) as s:
        job = s.get(Job, uuid.UUID(job_id))
        assert job is not None
        return str(job.tenant_id)


def test_a_submit_logs_its_request_job_and_tenant(client, sessions, lines: Lines) -> None:
    resp = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "text"}, headers={HEADER: "req-42.a"})
    assert resp.status_code == 202
    assert resp.headers[HEADER] == "req-42.a"
    job_id = resp.get_json()["id"]
    [line] = lines.matching("job accepted")
    assert line["request_id"] == "req-42.a" and line["job_id"] == job_id
    assert line["tenant"] == _tenant_of(sessions, job_id)
    assert line["level"] == "INFO" and line["logger"] == "genqueue.api" and line["time"]


def test_a_request_without_an_id_gets_one(client, lines: Lines) -> None:
    resp = submit(client)
    assert resp.status_code == 202
    rid = resp.headers[HEADER]
    assert GENERATED.fullmatch(rid)
    [line] = lines.matching("job accepted")
    assert line["request_id"] == rid
    # The next request on the same thread gets its own id, and none of the last job's fields.
    again = client.get("/v1/jobs", headers={"Authorization": "Bearer gq_bad"})
    assert again.headers[HEADER] != rid
    [rejected] = lines.matching("rejected API key")
    assert rejected["request_id"] == again.headers[HEADER] and "job_id" not in rejected


@pytest.mark.parametrize(
    "sent",
    ["x" * 129, "two words", "a\tb", "id;rm -rf", '"quoted"', "é", "", "{jndi:ldap://x}"],
)
def test_an_invalid_request_id_is_replaced(client, sent: str) -> None:
    resp = client.get("/v1/health", headers={HEADER: sent.encode().decode("latin-1")})
    assert resp.headers[HEADER] != sent and GENERATED.fullmatch(resp.headers[HEADER])


def test_problem_answers_carry_the_request_id(anon_client, client) -> None:
    cases = [
        (anon_client.get("/v1/jobs", headers={HEADER: "r-401"}), 401, "r-401"),
        (client.get(f"/v1/jobs/{uuid.uuid4()}", headers={HEADER: "r-404"}), 404, "r-404"),
        (client.post("/v1/jobs", json={"prompt": ""}, headers={HEADER: "r-422"}), 422, "r-422"),
        (client.get("/v1/nowhere", headers={HEADER: "r-route"}), 404, "r-route"),
    ]
    for resp, status, rid in cases:
        assert_problem(resp, status)
        assert resp.headers[HEADER] == rid


def test_a_worker_logs_each_task_with_its_job_stage_and_task_id(client, worker, sessions, lines) -> None:
    job_id = submit(client, prompt="[[transient]] every time").get_json()["id"]
    assert wait_finished(client, job_id)["status"] == "failed"
    # The job reads failed a moment before the task logs that it compensated it and ends.
    wait_for(lambda: lines.matching(f"job {job_id} compensated"), 10, what="the compensation line")
    mine = [line for line in lines.all() if line.get("task_id") == stage_task_id(job_id, "text")]
    # The stage's retry warnings, Celery's own retry lines and the compensation: all in the task.
    for expected in ("text stage: echo: transient failure", "retry: Retry in", "compensated"):
        assert any(expected in line["message"] for line in mine), (expected, lines.all())
    for line in mine:
        assert line["job_id"] == job_id and line["stage"] == "text", line
    assert any(line.get("tenant") == _tenant_of(sessions, job_id) for line in mine)
    # The next task on the same pool thread starts with no fields of this one.
    other = submit(client, prompt="[[transient]] again").get_json()["id"]
    wait_finished(client, other)
    for line in lines.all():
        if line.get("job_id") == job_id:
            assert other not in line["message"], line


@pytest.fixture
def gunicorn(settings, sessions, broker, tmp_path) -> Iterator[tuple[str, Any]]:
    """The production web server, JSON logs and the access log on; (base URL, log path)."""
    path = tmp_path / "gunicorn.log"
    env = {"GENQUEUE_LOG_FORMAT": "json", "GUNICORN_ACCESS_LOG": "-", "GENQUEUE_WEB_BODY_TIMEOUT_S": 1}
    with gunicorn_web(settings, path, **env) as base:
        yield base, path


def test_gunicorn_logs_json_and_keeps_concurrent_requests_apart(gunicorn, api_key: str) -> None:
    """20 submits at once on one gevent worker (a greenlet each): every line names its own request."""
    base, path = gunicorn
    auth = {"Authorization": f"Bearer {api_key}"}
    sent: dict[str, str] = {}  # request id -> job id
    errors: list[BaseException] = []

    def one(n: int) -> None:
        rid = f"conc-{n}-{uuid.uuid4().hex[:8]}"
        try:
            resp = httpx.post(f"{base}/v1/jobs", json={"prompt": f"fox {n}", "modality": "text"},
                              headers={**auth, HEADER: rid}, timeout=30)  # fmt: skip
            assert resp.status_code == 202, resp.text
            assert resp.headers[HEADER] == rid
            sent[rid] = resp.json()["id"]
        except BaseException as exc:  # reported below, from the test's thread
            errors.append(exc)

    threads = [threading.Thread(target=one, args=(n,)) for n in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    anonymous = httpx.get(f"{base}/v1/jobs", timeout=5)  # no id sent, a 401 problem
    assert anonymous.status_code == 401 and GENERATED.fullmatch(anonymous.headers[HEADER])

    def parsed() -> list[dict[str, Any]]:
        return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]

    # Every line is one JSON object, gunicorn's own included ("Booting worker", the access log).
    def logged() -> bool:  # every request's access line, the anonymous GET's included
        access = [x["message"] for x in parsed() if x["logger"] == "gunicorn.access"]
        return sum("POST /v1/jobs" in m for m in access) >= 20 and any("GET /v1/jobs " in m for m in access)

    wait_for(logged, 10, what="access")
    records = parsed()
    assert any(x["logger"] == "gunicorn.error" and "Booting worker" in x["message"] for x in records)
    accepted = [x for x in records if "job accepted" in x["message"]]
    assert len(accepted) == 20
    for line in accepted:
        assert sent[line["request_id"]] == line["job_id"], line  # never another request's id
    access = [x for x in records if x["logger"] == "gunicorn.access" and "POST /v1/jobs" in x["message"]]
    assert sorted(x["request_id"] for x in access) == sorted(sent)
    [anon] = [x for x in records if x["logger"] == "gunicorn.access" and "GET /v1/jobs " in x["message"]]
    assert anon["request_id"] == anonymous.headers[HEADER] and "job_id" not in anon


def _raw(port: int, data: bytes, wait_s: float = 0) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _header(raw: bytes, name: str) -> str | None:
    head = raw.partition(b"\r\n\r\n")[0].decode("latin-1")
    return next((v.strip() for k, _, v in (ln.partition(":") for ln in head.split("\r\n")[1:])
                 if k.lower() == name.lower()), None)  # fmt: skip


def test_gunicorn_protocol_errors_carry_a_request_id(gunicorn) -> None:
    """The answers gunicorn writes itself (408, 414) carry X-Request-Id too, and so do their lines."""
    base, path = gunicorn
    port = int(base.rsplit(":", 1)[1])
    slow = _raw(port, b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nX-Request-Id: slow-body-1\r\n"
                      b"Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{")  # fmt: skip
    assert slow.startswith(b"HTTP/1.1 408") and _header(slow, HEADER) == "slow-body-1", slow
    long_line = _raw(port, b"GET /" + b"a" * 9000 + b" HTTP/1.1\r\nHost: x\r\n\r\n")
    assert long_line.startswith(b"HTTP/1.1 414"), long_line
    assert GENERATED.fullmatch(_header(long_line, HEADER) or ""), long_line

    def body_line() -> list[dict[str, Any]]:
        records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
        return [r for r in records if "request body not received" in r["message"]]

    [line] = wait_for(body_line, 10, what="the 408 line")
    assert line["request_id"] == "slow-body-1"


def test_the_arbiter_loads_the_log_setup_without_the_app_stack() -> None:
    """gunicorn's arbiter reads ops/gunicorn.conf.py and imports app.server before it forks:
    neither may import Flask, SQLAlchemy or psycopg, which must wait for gevent's patching."""
    code = (
        "import runpy, sys; runpy.run_path('ops/gunicorn.conf.py'); import app.server; "
        "heavy = [m for m in ('flask', 'sqlalchemy', 'psycopg', 'celery') if m in sys.modules]; "
        "assert not heavy, heavy"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env={"PYTHONPATH": str(ROOT)})


@pytest.mark.slow
def test_a_worker_loading_real_models_writes_json_lines_and_no_progress_bars(
    settings, sessions, broker, client, tmp_path
) -> None:
    """`celery -A tasks.worker worker` as the Procfile runs it (JSON, --quiet), loading SmolLM2 and
    the tiny Wan pipeline at start: every line is JSON, no tqdm bar became a line, and the job's
    lines name it."""
    env = worker_env(
        settings, GENQUEUE_LOG_FORMAT="json", GENQUEUE_TEXT_MODEL="smollm2", GENQUEUE_VIDEO_MODEL="wan-tiny",
        GENQUEUE_WORKER_PRELOAD="text,video",
    )  # fmt: skip
    worker = Worker(env, "text,video,default", tmp_path, pool="threads", concurrency=2, quiet=True)
    worker.start(timeout=300)
    try:
        job_id = submit(client, prompt="a red kite").get_json()["id"]
        assert wait_finished(client, job_id, timeout=120)["status"] == "succeeded"
        wait_for(lambda: f"[{job_id}.text] succeeded" in worker.log_text(), 30, what="the success line")
    finally:
        worker.stop()
    text = worker.log_text()
    lines = [line for line in text.splitlines() if line.strip()]
    # Celery writes two things to the real stdout/stderr itself, not through logging: a warning
    # when the worker runs as root (test machines do) and its shutdown notice. Every other line
    # is one JSON object.
    plain = [line for line in lines if not line.startswith("{")]
    assert all(any(bit in line for bit in CELERY_OWN_WRITES) for line in plain), plain
    records = [json.loads(line) for line in lines if line.startswith("{")]
    assert any("models: text=smollm2" in r["message"] and "video=wan-tiny" in r["message"] for r in records)
    assert not re.search(r"\d+%\|| it/s|s/it\]", text), text[-3000:]  # no tqdm bar, raw or logged
    assert not [r for r in records if r["logger"] == "celery.redirected"], text[-3000:]
    mine = [r for r in records if r.get("job_id") == job_id]
    assert any("succeeded" in r["message"] for r in mine), text[-3000:]
    assert all(r["stage"] == "text" and r["task_id"] == stage_task_id(job_id, "text") for r in mine)
