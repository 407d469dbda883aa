"""/metrics under the production gunicorn (several worker processes): every process's counts, exactly once."""

from __future__ import annotations

import json
import os
import re
import runpy
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support import procs
from tests.support.api import make_api_key
from tests.support.procs import ROOT, wait_for

CONFIG = str(ROOT / "ops/gunicorn.conf.py")
PROBE = "/v1/jobs"  # unauthenticated: a 401 problem, no database; nothing else sends it


class Web:
    """A gunicorn master started as the Procfile does, with an access log naming the worker pid."""

    def __init__(self, proc: subprocess.Popen[bytes], base: str, log: Path) -> None:
        self.proc, self.base, self.log = proc, base, log

    def workers(self) -> list[psutil.Process]:
        return [p for p in psutil.Process(self.proc.pid).children() if p.status() != psutil.STATUS_ZOMBIE]

    def probe(self, n: int) -> None:
        """n requests, each on its own connection, 8 at a time, so every worker takes some."""

        def one(_: int) -> int:
            return httpx.get(self.base + PROBE, headers={"Connection": "close"}, timeout=10).status_code

        with ThreadPoolExecutor(8) as pool:
            assert set(pool.map(one, range(n))) == {401}

    def kill_and_replace(self, victim: psutil.Process) -> None:
        """SIGKILL one worker; return once gunicorn's replacement has loaded the app (its metrics
        files exist): a server stopped while a worker still boots waits out graceful_timeout."""
        before = {p.pid for p in self.workers()}
        victim.send_signal(signal.SIGKILL)

        def replaced() -> bool:
            pids = {p.pid for p in self.workers()}
            new = pids - before
            return len(pids) == len(before) and bool(new) and all(self.loaded(p) for p in new)

        wait_for(replaced, 60, what="gunicorn to replace the killed worker")

    def loaded(self, pid: int) -> bool:
        metrics_dir = Path(self.metrics_dir())
        return (metrics_dir / f"gauge_livesum_{pid}.db").exists()

    def metrics_dir(self) -> str:
        # The master's private directory (these tests give none of their own when they kill).
        return str(next(self.log.parent.glob("tmp/genqueue-web-metrics-*")))

    def pids_served(self) -> set[int]:
        # Access lines are JSON log lines on the server's stderr (models.logs); the message is
        # the --access-logformat below.
        pids = set()
        for line in self.log.read_text(errors="replace").splitlines():
            try:
                message = json.loads(line).get("message", "")
            except (ValueError, AttributeError):
                continue
            if m := re.fullmatch(rf"<(\d+)> {re.escape(PROBE)}", message):
                pids.add(int(m.group(1)))
        return pids

    def scrape(self) -> dict[tuple[str, str], float]:
        """{(endpoint, status): requests} and {("problem", type): count} from one /metrics."""
        text = httpx.get(self.base + "/metrics", headers={"Connection": "close"}, timeout=10).text
        out: dict[tuple[str, str], float] = {}
        for family in text_string_to_metric_families(text):
            for s in family.samples:
                if s.name == "genqueue_http_requests_total":
                    key = (s.labels["endpoint"], s.labels["status"])
                    out[key] = out.get(key, 0) + s.value
                elif s.name == "genqueue_http_problems_total":
                    out[("problem", s.labels["type"])] = s.value
                elif s.name == "genqueue_http_requests_in_progress":
                    out[("in_progress", "")] = s.value
        return out


@contextmanager
def gunicorn(settings, tmp_path: Path, workers: int = 2, **given: str) -> Iterator[Web]:
    tmp = tmp_path / "tmp"  # where the master makes its private metrics directory
    tmp.mkdir(exist_ok=True)
    # The master makes its own private metrics directory unless the caller gives one.
    env: dict[str, str | None] = {
        "TMPDIR": str(tmp),
        "GUNICORN_ACCESS_LOG": "1",
        "GENQUEUE_LOG_FORMAT": "json",  # the access lines are read as JSON (pids_served)
        "PROMETHEUS_MULTIPROC_DIR": None,
    }
    env |= given
    args = ("--access-logformat", "%(p)s %(U)s")
    with procs.gunicorn(settings, tmp_path / "gunicorn.log", *args, workers=workers, **env) as server:
        yield Web(server.proc, server.base, server.log)


def private_dirs(tmp_path: Path) -> list[Path]:
    return list((tmp_path / "tmp").glob("genqueue-web-metrics-*"))


def assert_counts(web: Web, n: int, scrapes: int = 5) -> None:
    """Scrape after scrape: exactly n probes, and exactly the scrapes before this one."""
    base = web.scrape().get(("/metrics", "200"), 0)
    for i in range(scrapes):
        seen = web.scrape()
        assert seen[(PROBE, "401")] == n, seen
        assert seen[("problem", "unauthorized")] == n, seen
        assert seen[("/metrics", "200")] == base + 1 + i, seen  # the earlier scrapes, each once


def test_every_worker_is_counted_once_scrape_after_scrape(settings, sessions, tmp_path):
    with gunicorn(settings, tmp_path, workers=3) as web:
        (metrics_dir,) = private_dirs(tmp_path)
        assert stat.S_IMODE(metrics_dir.stat().st_mode) == 0o700  # private to the server's user
        web.probe(60)
        assert len(web.pids_served()) >= 2, web.pids_served()  # several processes served them
        assert_counts(web, 60)
        web.probe(20)
        assert_counts(web, 80)
        assert {f"counter_{p.pid}.db" for p in web.workers()} <= {f.name for f in metrics_dir.iterdir()}
    assert private_dirs(tmp_path) == []  # removed with the server


@pytest.mark.slow
def test_a_killed_worker_keeps_its_counts_and_is_not_counted_twice(settings, sessions, tmp_path):
    with gunicorn(settings, tmp_path, workers=2) as web:
        web.probe(40)
        served = web.pids_served()
        victim = next(p for p in web.workers() if p.pid in served)
        web.kill_and_replace(victim)
        assert_counts(web, 40)  # the dead worker's share still counts, once
        web.probe(40)
        assert_counts(web, 80)


def _held_submit(web: Web, key: str) -> socket.socket:
    """A submit with `Prefer: wait=30` (no worker runs: it is held), on a connection kept open."""
    body = json.dumps({"prompt": "a fox", "modality": "text"}).encode()
    head = (
        f"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {key}\r\nPrefer: wait=30\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    sock = socket.create_connection(("127.0.0.1", int(web.base.rsplit(":", 1)[1])), timeout=30)
    sock.sendall(head.encode() + body)
    return sock


@pytest.mark.slow
def test_in_progress_drops_a_killed_workers_requests(settings, sessions, broker, tmp_path):
    """A live gauge sums the live workers only: child_exit removes a dead worker's share."""
    key = make_api_key(sessions)
    with gunicorn(settings, tmp_path, workers=2) as web:
        assert web.scrape()[("in_progress", "")] == 1  # the scrape itself
        held = _held_submit(web, key)
        wait_for(lambda: web.scrape()[("in_progress", "")] == 2, 10, what="the held submit")
        port = held.getsockname()[1]
        (holder,) = [
            p for p in web.workers() if any(c.raddr and c.raddr.port == port for c in p.net_connections())
        ]
        web.kill_and_replace(holder)
        held.close()
        for _ in range(3):
            assert web.scrape()[("in_progress", "")] == 1


@pytest.mark.slow
def test_a_given_multiprocess_dir_is_emptied_at_start(settings, sessions, tmp_path):
    """PROMETHEUS_MULTIPROC_DIR set by the operator: values left there by an earlier run are gone."""
    given = tmp_path / "given"
    given.mkdir()
    stale = (
        "from prometheus_client import Counter; "
        "Counter('genqueue_http_requests', 'x', ['endpoint', 'method', 'status'])"
        f".labels({PROBE!r}, 'GET', '401').inc(1000)"
    )
    env = {**os.environ, "PROMETHEUS_MULTIPROC_DIR": str(given)}
    subprocess.run([sys.executable, "-c", stale], env=env, check=True)
    assert list(given.glob("counter_*.db"))
    with gunicorn(settings, tmp_path, workers=2, PROMETHEUS_MULTIPROC_DIR=str(given)) as web:
        assert private_dirs(tmp_path) == []
        web.probe(10)
        assert_counts(web, 10, scrapes=2)
    assert given.is_dir()  # the operator's directory stays


def test_a_reexecuted_master_makes_its_own_directory(monkeypatch, tmp_path):
    """USR2 starts a new master that inherits the old one's variable: it must not empty (nor later
    lose) the directory the old master's workers still write to, so it makes its own."""
    monkeypatch.setattr(
        os, "environ", {k: v for k, v in os.environ.items() if k != "PROMETHEUS_MULTIPROC_DIR"}
    )
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    conf = runpy.run_path(CONFIG)
    conf["_setup_metrics_dir"]()
    old = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    (old / "counter_1.db").write_bytes(b"x")  # a live old worker's values
    conf["_setup_metrics_dir"]()  # the re-executed master, same environment
    new = Path(os.environ["PROMETHEUS_MULTIPROC_DIR"])
    assert new != old and (old / "counter_1.db").exists()
    conf["on_exit"](None)
    assert not new.exists() and old.exists()


def test_a_held_submit_is_timed_until_its_hold_starts(app, client) -> None:
    """`Prefer: wait` holds a submit while its job runs (here: no worker, the whole 2 s): the latency
    histogram measures the submit, so the submit-latency alert does not fire on held requests."""
    registry = app.extensions["genqueue"].metrics.registry
    labels = {"endpoint": "/v1/jobs", "method": "POST"}
    started = time.perf_counter()
    resp = client.post("/v1/jobs", json={"prompt": "a fox", "modality": "text"}, headers={"Prefer": "wait=2"})
    took = time.perf_counter() - started
    assert resp.status_code == 202 and took >= 2
    assert registry.get_sample_value("genqueue_http_request_duration_seconds_count", labels) == 1
    assert registry.get_sample_value("genqueue_http_request_duration_seconds_sum", labels) < took - 1.5
