"""The worker contract: app/ imports only tasks.contract (and named exceptions); the contract stands alone."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CONTRACT = "tasks.contract"

# The only tasks modules app/ may import outside the contract, and why.
ALLOWED_IN_APP = {
    # One factory builds the publishing app and the workers' app, so both get the same broker
    # transport options, queue declarations and routes; a separate publisher factory could drift.
    "tasks.celery_app",
    # `genqueue demo` / `serve --embedded` run a worker in the CLI process by design (lazy import).
    "tasks.embedded",
    # `genqueue worker` supervises the Celery worker process: when that process is killed, the
    # supervisor puts back the Redis messages the worker recorded holding (lazy import).
    "tasks.held_messages",
}


def _imported(path: Path) -> Iterator[tuple[int, str]]:
    """(line, module) for every import in the file, at any depth; `from tasks import x` is tasks.x."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module
            for alias in node.names:  # a submodule imported by name
                yield node.lineno, f"{node.module}.{alias.name}"


def _under(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _outside(name: str, allowed: set[str]) -> bool:
    """A tasks submodule outside the contract and the allowed ones. The bare `tasks` package that
    `from tasks import x` also yields is not judged: its `tasks.x` line is."""
    return name.startswith("tasks.") and not any(_under(name, p) for p in {CONTRACT, *allowed})


def test_app_imports_only_the_contract_of_tasks() -> None:
    files = sorted((ROOT / "app").rglob("*.py"))
    assert len(files) > 10, files  # the walk found app/
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in files
        for line, name in _imported(path)
        if _outside(name, ALLOWED_IN_APP)
    ]
    assert not bad, "app/ reaches into tasks/ outside tasks.contract:\n" + "\n".join(bad)


def test_the_contract_imports_nothing_else_of_tasks_nor_app() -> None:
    files = sorted((ROOT / "tasks" / "contract").glob("*.py"))
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in files
        for line, name in _imported(path)
        if _under(name, "app") or _outside(name, set())
    ]
    assert not bad, "tasks.contract depends on more than itself and models:\n" + "\n".join(bad)


def test_the_contract_loads_no_worker_code_and_no_torch() -> None:
    """Importing every contract module, in a fresh process, loads no other tasks module and no torch."""
    mods = ", ".join(f"{CONTRACT}.{p.stem}" for p in sorted((ROOT / "tasks" / "contract").glob("[!_]*.py")))
    code = (
        f"import sys, {mods}; "
        "up = sorted(m for m in sys.modules "
        "if m.startswith('tasks.') and not m.startswith('tasks.contract')); "
        "assert not up, up; assert 'torch' not in sys.modules, 'torch imported'"
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, env=env)
