"""README.md's API walk as written: each curl command, in order, against the production web server
and a real worker, answers the status the README gives it (its error example: test_api_validation)."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.support.procs import gunicorn_web, wait_for

README = Path(__file__).resolve().parents[1] / "README.md"
README_HOST = "localhost:8000"
STATUS = re.compile(r"(?:^|\s)#\s*(\d{3})\b")  # "# 202 Accepted", "   # 200: ..."
UNTIL = re.compile(r'until "(\w+)"')  # "again until "succeeded"": poll the job


@dataclass
class Step:
    argv: list[str]  # curl's arguments as the shell would pass them
    status: int
    until: str | None  # repeat while the job's status is not this one


def walk() -> list[Step]:
    """The curl commands of the `## Try the API` block with the status each documents: in the
    comment after the command or on the comment line right below it."""
    block = re.search(r"## Try the API\s*```sh\n(.*?)```", README.read_text(), re.S)
    assert block, "README.md's API walk moved"
    lines = block.group(1).splitlines()
    steps: list[Step] = []
    i = 0
    while i < len(lines):
        if not lines[i].startswith("curl "):
            i += 1
            continue
        command = lines[i]
        while _open(command):  # a `\\` continuation or a quoted body spanning lines
            i += 1
            command += "\n" + lines[i]
        last = command.rsplit("\n", 1)[-1]
        below = lines[i + 1] if i + 1 < len(lines) else ""
        found = STATUS.search(last) or (STATUS.match(below) if below.startswith("#") else None)
        assert found, f"README.md documents no status for: {command}"
        comment = last.partition(" #")[2] or below
        until = UNTIL.search(comment)
        argv = shlex.split(command.replace("\\\n", " "), comments=True)
        steps.append(Step(argv[1:], int(found.group(1)), until.group(1) if until else None))
        i += 1
    return steps


def _open(command: str) -> bool:
    if command.endswith("\\"):
        return True
    try:
        shlex.split(command, comments=True)
    except ValueError:  # No closing quotation
        return True
    return False


def test_the_walk_is_found() -> None:
    steps = walk()
    assert [s.status for s in steps][:1] == [202] and len(steps) >= 6
    assert all(any(README_HOST in a for a in s.argv) for s in steps)


@pytest.fixture
def web(settings, sessions, broker, worker, tmp_path) -> Iterator[str]:
    """The production web server (gunicorn) with a real worker running the echo models."""
    with gunicorn_web(settings, tmp_path / "gunicorn.log") as base:
        yield base


def _curl(step: Step, base: str, auth: str, job_id: str | None, cwd: Path) -> tuple[int, str]:
    host = base.removeprefix("http://")
    argv = []
    for arg in step.argv:
        arg = arg.replace("$AUTH", auth).replace(README_HOST, host)
        if job_id is not None:
            arg = arg.replace("<id>", job_id)
        argv.append(arg)
    assert not any("<id>" in a for a in argv), "a command uses <id> before a job was submitted"
    out = subprocess.run(
        ["curl", *argv, "-w", "\n%{http_code}"], cwd=cwd, capture_output=True, text=True, timeout=60
    )
    body, _, code = out.stdout.rpartition("\n")
    return int(code), body


def test_the_readmes_walk_answers_as_documented(web, api_key, tmp_path) -> None:
    auth = f"Authorization: Bearer {api_key}"
    job_id: str | None = None
    for step in walk():
        status, body = _curl(step, web, auth, job_id, tmp_path)
        assert status == step.status, (step.argv, status, body[:500])
        if job_id is None:
            job_id = json.loads(body)["id"]  # the first command submits the job the others use
        if step.until is not None:

            def reached(step: Step = step, job_id: str | None = job_id) -> Any:
                status, body = _curl(step, web, auth, job_id, tmp_path)
                assert status == step.status, (step.argv, status, body[:500])
                return json.loads(body)["status"] == step.until

            wait_for(reached, 60, 0.2, f"the README's job to be {step.until}")
        if "-o" in step.argv:
            written = tmp_path / step.argv[step.argv.index("-o") + 1]
            assert written.stat().st_size > 0, written
