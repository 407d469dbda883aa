"""Client test helpers (genqueue_client, the CLI): an httpx answer recorder, the web server."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import httpx
import pytest

from tests.support.procs import gunicorn_web


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
