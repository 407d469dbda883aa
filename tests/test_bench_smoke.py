"""The benchmark scripts still run end to end (tiny durations) and print their ratios; no speed is judged."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

SCRIPTS = {
    "api": ["--duration", "0.5", "--warmup", "0.2", "--backlog", "20", "--concurrency", "8"],
    # 20 chains a turn: 5 bare chains cost under one 10 ms clock tick
    "pipeline": ["--jobs", "40", "--warmup", "1", "--rounds", "2", "--account"],
    "memory": ["--requests", "100", "--warmup-requests", "20", "--connections", "8", "--jobs", "5",
               "--warmup-jobs", "1"],
    "image": ["--rounds", "1", "--requests", "2"],
    "sse": ["--streams", "20", "--jobs", "4", "--duration", "1", "--warmup", "0.5", "--concurrency", "4"],
    "batch_submit": ["--duration", "1", "--warmup", "0.3", "--batch", "50", "--concurrency", "8"],
    "stage_costs": ["--n", "60", "--rounds", "2"],
}
# (metric, whether its ratio must be a positive number: a memory growth baseline may be 0 -> nan)
EXPECTED = {
    "api": [("throughput", True), ("p50 latency", True), ("p99 latency", True)],
    "pipeline": [("jobs/s (text->video)", True), ("server CPU per job", True)],
    "memory": [("web RSS growth/1k req", False), ("worker RSS growth/1k jobs", False)],
    "sse": [("submit p99", True), ("streams open", True)],
    "batch_submit": [("jobs accepted per s", True), ("server CPU per job", True)],
    "image": [("request s (default job)", True), ("images/s (batched)", True)],
    # Redis's and Postgres's CPU for 60 operations may fall under one clock tick: only the clients'.
    "stage_costs": [("client CPU per message", True), ("client CPU", True), ("Postgres CPU", False)],
}
RATIO = re.compile(r" ratio (-?\d+\.\d+|nan)x")


@pytest.mark.slow
@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_benchmark_runs_and_prints_its_ratio(script: str) -> None:
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1")
    proc = subprocess.run(
        [sys.executable, "-m", f"bench.{script}", *SCRIPTS[script]],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=300, check=False,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    if "--account" in SCRIPTS[script]:  # the worker's own accounting of a job's pieces
        line = re.search(r"thread CPU per job over \d+ jobs: tasks \d+\.\d+ ms = (.*)", proc.stdout)
        assert line, proc.stdout  # the pieces, largest first: their order varies
        assert {"transitions", "encode", "next step", "generate", "the rest"} <= {
            re.sub(r" -?\d+\.\d+$", "", part) for part in line.group(1).split(", ")
        }, line.group(0)
    results = [ln for ln in proc.stdout.splitlines() if RATIO.search(ln)]
    for metric, positive in EXPECTED[script]:
        lines = [ln for ln in results if f" {metric} " in ln]
        assert lines, f"no {metric!r} result in:\n{proc.stdout}"
        for line in lines:
            ratio = float(RATIO.search(line).group(1))  # type: ignore[union-attr]
            if positive:
                assert ratio > 0, line  # both sides measured something
