"""Where a web worker's time goes under submit or poll load: py-spy samples, top frames by share."""

from __future__ import annotations

import argparse
import collections
import json
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Sequence
from pathlib import Path

from bench.api import JOB, _fill, _seed, servers
from bench.common import run_load

_OWN = ("(app/", "/app/", "(models/", "/models/")


def _top(collapsed: Path, limit: int, own_code: bool) -> list[tuple[float, str]]:
    """Inclusive share of samples per frame (counted once per stack) from py-spy's raw output."""
    totals: collections.Counter[str] = collections.Counter()
    samples = 0
    for line in collapsed.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        n = int(count)
        samples += n
        # py-spy names this checkout's files relative to it ("(app/jobs.py:230)"), others absolute.
        frames = {f for f in stack.split(";") if not own_code or any(d in f for d in _OWN)}
        for frame in frames:
            totals[frame] += n
    return [(100 * n / samples, frame) for frame, n in totals.most_common(limit)] if samples else []


def run(args: argparse.Namespace) -> None:
    spy_bin = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))
    if not Path(spy_bin).exists():
        raise SystemExit("py-spy is not installed (pip install py-spy)")
    with servers() as srv, tempfile.TemporaryDirectory() as tmp:
        genqueue = srv.genqueue
        worker_pids = [p.pid for p in srv.genqueue_proc.children()]
        concurrency = 64
        if args.endpoint == "submit":

            def request(_n: int) -> tuple[str, str, object]:
                return "POST", genqueue + "/v1/jobs", JOB

        elif args.endpoint == "batch":  # POST /v1/jobs/batch, as bench.batch_submit sends it
            batch = json.dumps({"jobs": [JOB] * args.batch}).encode()
            srv.headers["Content-Type"] = "application/json"
            concurrency = 4

            def request(_n: int) -> tuple[str, str, object]:
                return "POST", genqueue + "/v1/jobs/batch", batch

        else:
            import random

            _fill(srv.db_url, args.fill)
            ids = _seed(srv.db_url, 100)  # polled at random, behind the --fill older ones
            rng = random.Random(1)

            def request(_n: int) -> tuple[str, str, object]:
                return "GET", f"{genqueue}/v1/jobs/{rng.choice(ids)}", None

        run_load(request, duration=1.0, headers=srv.headers, concurrency=concurrency)  # warm-up
        outs = [Path(tmp, f"{pid}.txt") for pid in worker_pids]
        spies = [
            subprocess.Popen(
                [
                    spy_bin,
                    "record",
                    "--pid",
                    str(pid),
                    "--duration",
                    str(int(args.duration)),
                    "--format",
                    "raw",
                    "--nonblocking",
                    "--output",
                    str(out),
                    *(["--gil"] if args.gil else []),
                ],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            for pid, out in zip(worker_pids, outs, strict=True)
        ]
        load_args = {"duration": args.duration, "headers": srv.headers, "concurrency": concurrency}
        loader = threading.Thread(target=run_load, args=(request,), kwargs=load_args)
        loader.start()
        loader.join()
        for spy in spies:
            spy.wait(timeout=60)
        merged = Path(tmp, "all.txt")
        merged.write_text("".join(o.read_text() for o in outs if o.exists()))
        print(f"{args.endpoint}: inclusive share of web-worker samples (busy threads)")
        for share, frame in _top(merged, args.top, args.own_code):
            print(f"{share:5.1f}%  {frame}")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("endpoint", choices=("submit", "poll", "batch"))
    parser.add_argument("--batch", type=int, default=500, help="jobs per batch (endpoint batch)")
    parser.add_argument("--duration", type=float, default=8.0)
    parser.add_argument("--top", type=int, default=40)
    parser.add_argument("--gil", action="store_true", help="only the thread holding the GIL (CPU time)")
    parser.add_argument("--fill", type=int, default=0, help="poll: older queued jobs ahead of the polled")
    parser.add_argument("--own-code", action="store_true", help="only frames in app/ and models/")
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main()
