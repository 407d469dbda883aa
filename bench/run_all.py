"""Run every benchmark in turn (short or full durations) and print one summary table."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bench import api, memory, pipeline
from bench.common import Result, machine


def _table(results: Sequence[Result]) -> str:
    names = ("benchmark", "metric", "genqueue", "baseline")
    head = "| {:<9} | {:<26} | {:>10} | {:>10} | unit   | ratio | goal |".format(*names)
    rule = "|" + "|".join("-" * (len(c)) for c in head.split("|")[1:-1]) + "|"
    rows = [
        f"| {r.bench:<9} | {r.metric:<26} | {r.value:>10.2f} | {r.baseline:>10.2f} | {r.unit:<6} | "
        f"{r.ratio:.2f}x | {r.goal} |"
        for r in results
    ]
    return "\n".join([head, rule, *rows])


def main(argv: Sequence[str] | None = None) -> list[Result]:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="tiny durations, no real numbers")
    args = parser.parse_args(argv)
    if args.quick:
        runs = [
            (api.main, ["--duration", "1", "--warmup", "0.5", "--backlog", "50"]),
            (pipeline.main, ["--jobs", "10", "--warmup", "2"]),
            (memory.main, ["--requests", "200", "--warmup-requests", "50", "--jobs", "10",
                           "--warmup-jobs", "2"]),
        ]
    else:
        runs = [(api.main, []), (pipeline.main, []), (memory.main, [])]
    results: list[Result] = []
    for bench_main, bench_args in runs:
        results += bench_main(bench_args)
        print()
    print(f"Summary ({machine()}):")
    print(_table(results))
    return results


if __name__ == "__main__":
    main()
