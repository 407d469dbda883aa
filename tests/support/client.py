"""Client test helpers (genqueue_client, the CLI): an httpx answer recorder, the web server, the
`genqueue` command as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.procs import ROOT, gunicorn_web


@dataclass
class Exchange:
    method: str
    path: str
    status: int
    request_headers: dict[str, str]
    response_headers: dict[str, str]


@dataclass
class Recorder:
    """The answers an httpx client got, in order (event hooks: sync and async alike)."""

    seen: list[Exchange] = field(default_factory=list)

    def note(self, resp: httpx.Response) -> None:
        req = resp.request
        self.seen.append(
            Exchange(req.method, req.url.path, resp.status_code, dict(req.headers), dict(resp.headers))
        )

    async def anote(self, resp: httpx.Response) -> None:
        self.note(resp)

    def statuses(self, path_end: str = "") -> list[int]:
        return [e.status for e in self.seen if e.path.endswith(path_end)]


def start_web(settings: Any, factory: pytest.TempPathFactory, **env: Any) -> Any:
    """gunicorn_web (ops/gunicorn.conf.py, one worker) with `env`; a context manager of its URL."""
    return gunicorn_web(settings, factory.mktemp("web") / "gunicorn.log", **env)


def environment(web: str, key: str) -> dict[str, str]:
    """This process's environment without the server's settings, with the client's two."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GENQUEUE_")}
    return env | {"GENQUEUE_URL": web, "GENQUEUE_API_KEY": key, "PYTHONPATH": str(ROOT)}


def genqueue(web: str, key: str, *args: str, **kw: Any) -> subprocess.CompletedProcess[str]:
    """`genqueue ARGS` as a user runs it, against `web` with `key`; its output and exit code."""
    cmd = [sys.executable, "-m", "app.cli", *args]
    return subprocess.run(cmd, env=environment(web, key), capture_output=True, text=True, timeout=120, **kw)


def spawn(web: str, key: str, *args: str) -> subprocess.Popen[bytes]:
    """`genqueue ARGS` started in the background (to be canceled or interrupted meanwhile), with
    SIGINT at its default as in a terminal: a suite run from a non-interactive shell's background
    job inherits it ignored, and Python then installs no KeyboardInterrupt handler."""
    # coreutils' env resets SIGINT before the exec; a preexec_fn would run Python in the forked
    # child of this threaded process, which can hang before the exec.
    cmd = ["env", "--default-signal=INT", sys.executable, "-m", "app.cli", *args]
    return subprocess.Popen(cmd, env=environment(web, key), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
