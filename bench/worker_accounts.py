"""`celery -A bench.worker_accounts worker`: tasks.worker with a job's pieces timed in thread CPU.

For `python -m bench.pipeline --account`: where a Genqueue worker's CPU per job goes, measured
inside the worker (time.thread_time around each piece, user + system of the thread that ran
it), not sampled by a profiler (py-spy's samples of the same run put a third of the pool's time
in the transitions' SQLAlchemy session, which removing it did not confirm). Each process writes
{piece: [seconds, calls]} as JSON to GENQUEUE_BENCH_ACCOUNTS_DIR/<pid>.json every 10 tasks and
at its stop.
The wrappers are installed when the worker starts (worker_init, before the pool forks). Prefork
pool only: in a threads pool the model runs in the batcher's thread, whose time no task's
thread counts.
"""

from __future__ import annotations

import functools
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from celery.signals import task_postrun, task_prerun, worker_init, worker_process_shutdown

from tasks.worker import celery

__all__ = ["celery"]

ENV = "GENQUEUE_BENCH_ACCOUNTS_DIR"
# (module, attribute the pipeline calls through, piece): each looked up at call time.
PIECES = (
    ("tasks.pipeline", "alone", "transitions"),  # a stage's entry and its completion
    ("tasks.pipeline", "run_batched", "generate"),  # the (echo) model, through the batcher
    ("tasks.artifacts", "write_video", "encode"),  # the MP4 and the thumbnail, written
    ("tasks.continuation", "send_next", "next step"),  # the chain's next message
    ("tasks.outcome", "settle", "settle"),  # what the end means for the files
)

_totals: dict[str, list[float]] = {}
_local = threading.local()


def _add(piece: str, seconds: float) -> None:
    entry = _totals.setdefault(piece, [0.0, 0])
    entry[0] += seconds
    entry[1] += 1


def _timed(piece: str, fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        started = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            _add(piece, time.thread_time() - started)

    return timed


def _dump(**_: Any) -> None:
    folder = os.environ.get(ENV)
    if folder:  # whole or not at all: read() may run while this process writes
        final = Path(folder, f"{os.getpid()}.json")
        tmp = final.with_suffix(".tmp")
        tmp.write_text(json.dumps(_totals))
        os.replace(tmp, final)


def _started(**_: Any) -> None:
    _local.started = time.thread_time()


def _finished(**_: Any) -> None:
    started = getattr(_local, "started", None)
    if started is None:
        return
    _add("task", time.thread_time() - started)
    if _totals["task"][1] % 10 == 0:
        _dump()


def _install(**_: Any) -> None:
    import importlib

    for module, name, piece in PIECES:
        owner = importlib.import_module(module)
        setattr(owner, name, _timed(piece, getattr(owner, name)))
    os.register_at_fork(after_in_child=_totals.clear)  # each pool child counts its own
    task_prerun.connect(_started, weak=False)
    task_postrun.connect(_finished, weak=False)
    worker_process_shutdown.connect(_dump, weak=False)  # the last tasks, at a clean stop


worker_init.connect(_install, weak=False)


def read(folder: str | Path) -> dict[str, list[float]]:
    """Every process's totals in `folder`, added up: {piece: [seconds, calls]}."""
    out: dict[str, list[float]] = {}
    for path in Path(folder).glob("*.json"):
        for piece, (seconds, calls) in json.loads(path.read_text()).items():
            entry = out.setdefault(piece, [0.0, 0])
            entry[0] += seconds
            entry[1] += calls
    return out
