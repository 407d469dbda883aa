"""genqueue_client without a server: every server problem type maps to a client error, the package
imports nothing of the server, and the SSE decoder and retry policy follow their rules."""

from __future__ import annotations

import ast
import importlib
import json
import pkgutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

import genqueue_client as gq
from genqueue_client import errors
from genqueue_client.core import Retry
from genqueue_client.sse import Decoder

ROOT = Path(__file__).resolve().parents[1]


def _server_error_classes() -> list[type]:
    import app
    from app.errors import ApiError

    for mod in pkgutil.iter_modules(app.__path__):  # every module's own ApiError subclasses
        importlib.import_module(f"app.{mod.name}")
    found, todo = [ApiError], [ApiError]
    while todo:
        for sub in todo.pop().__subclasses__():
            found.append(sub)
            todo.append(sub)
    return found


def test_every_server_problem_type_maps_to_a_client_error() -> None:
    classes = _server_error_classes()
    assert len(classes) > 15, classes  # the walk found them (invalid-link and expired-link included)
    for cls in classes:
        err = cls()
        mapped = errors.error_class(err.status, err.type)
        assert issubclass(mapped, gq.APIError), cls
        if err.slug:  # a named type: a class that names it
            assert err.slug in mapped.slugs, (cls, mapped)
        else:  # about:blank: the status's class, or the 4xx/5xx base
            assert mapped.status_code == err.status or mapped in (gq.ClientError, gq.ServerError), cls
        assert issubclass(mapped, gq.ServerError if err.status >= 500 else gq.ClientError), cls


def test_a_type_this_client_does_not_know_falls_back_by_status() -> None:
    future = "tag:genqueue,2025:problem:something-new"
    assert errors.error_class(404, future) is gq.NotFound
    assert errors.error_class(418, future) is gq.ClientError
    assert errors.error_class(502, "about:blank") is gq.ServerError
    err = errors.from_response(502, b"<html>Bad gateway</html>", {"Retry-After": "7"})
    assert isinstance(err, gq.ServerError) and "Bad gateway" in err.detail and err.retry_after == 7
    body = {"type": errors.PROBLEM_BASE + "overloaded", "status": 503, "detail": "behind", "stage": "video"}
    over = errors.from_response(503, json.dumps(body).encode(), {})
    assert isinstance(over, gq.Overloaded) and isinstance(over, gq.ServiceUnavailable)
    assert over.problem["stage"] == "video"


def _imports(path: Path) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.add(node.module.split(".")[0])
    return out


@pytest.mark.parametrize(
    ("files", "allowed"),
    [
        (sorted((ROOT / "genqueue_client").glob("*.py")), {"httpx", "standardwebhooks", "genqueue_client"}),
        ([ROOT / "app" / "client_cli.py"], {"click", "tqdm", "genqueue_client"}),
    ],
)
def test_the_client_imports_nothing_of_the_server(files: list[Path], allowed: set[str]) -> None:
    assert files
    for path in files:
        foreign = _imports(path) - set(sys.stdlib_module_names) - allowed - {"__future__"}
        assert not foreign, f"{path.relative_to(ROOT)} imports {sorted(foreign)}"
    code = (
        "import sys, genqueue_client, app.client_cli; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'models', 'tasks', 'flask', 'sqlalchemy'}))"
    )
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


def test_the_sse_decoder_reads_frames_comments_and_multiline_data() -> None:
    lines = [
        "retry: 2000", "", ": heartbeat", "",
        "id: 7", "event: job.started",
        'data: {"id": 7, "type": "job.started",', 'data:  "stage": "text"}', "",
        "event: job.progress", 'data: {"id": null, "type": "job.progress", "data": {"progress": 40}}', "",
    ]  # fmt: skip
    started, progress = list(Decoder().feed(lines))
    assert (started.id, started.type, started.stage) == (7, "job.started", "text")
    assert (progress.id, progress.progress, progress.terminal) == (None, 40, False)


def test_retry_honours_retry_after_up_to_the_budget() -> None:
    retry = Retry(max_retries=2, backoff_s=0.5, max_backoff_s=30)
    limited = httpx.Response(429, headers={"Retry-After": "3"})
    assert [retry.after_response(limited), retry.after_response(limited), retry.after_response(limited)] == [
        3.0, 3.0, None,
    ]  # fmt: skip
    assert Retry(3, 0.5, 30).after_response(httpx.Response(503, headers={"Retry-After": "120"})) is None
    assert Retry(3, 0.5, 30).after_response(httpx.Response(500)) is None  # not a "come back later"
    backoff = Retry(3, 0.5, 30).after_response(httpx.Response(503))
    assert backoff is not None and 0.25 <= backoff <= 0.5
    spent = Retry(0, 0.5, 30)
    with pytest.raises(gq.TransportError):
        spent.after_transport_error(httpx.ConnectError("refused"))
