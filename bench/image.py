"""Image-stage benchmark: the tiny SanaPipeline's time per request, and batching N same-shaped requests.

    PYTHONPATH=$PWD python -m bench.image [--model sana-tiny] [--requests 4] [--rounds 3]

Two figures, each against its baseline taken in the same run, best of --rounds:
  request   one default image job's render (GENQUEUE_DEFAULT_IMAGE_* sides, default steps and
            guidance, one image) against a one-step render of the same size (the fixed cost);
  batch     N same-shaped requests as one generate() call (one pipeline call, as the image
            worker's batcher makes) against the same N one by one.
The adapter runs in this process (no worker, database or broker): what the model costs.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

from bench.common import Result, machine, print_results
from models.settings import Settings
from tasks.generators.base import ImageRequest
from tasks.generators.registry import get_generator

PROMPTS = ["a lighthouse at dusk", "a red kite over the sea", "a cat on a windowsill", "a tram in the rain"]


def _best(run: Callable[[], object], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: list[str] | None = None) -> list[Result]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="sana-tiny", help="GENQUEUE_IMAGE_MODEL: a name or a local folder")
    ap.add_argument("--requests", type=int, default=4, help="same-shaped requests in the batch figure")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args(argv)
    s = Settings()
    print(f"image: model {args.model}, {args.requests} requests, best of {args.rounds}; {machine()}")
    gen = get_generator("image", args.model)
    side = {"width": s.default_image_width, "height": s.default_image_height}
    default = ImageRequest(
        PROMPTS[0], steps=s.default_steps, guidance_scale=s.default_image_guidance, seed=1, **side
    )
    one_step = ImageRequest(PROMPTS[0], steps=1, guidance_scale=s.default_image_guidance, seed=1, **side)
    reqs = [
        ImageRequest(PROMPTS[k % len(PROMPTS)], steps=s.default_steps, seed=k, **side)
        for k in range(args.requests)
    ]
    request_s = _best(lambda: gen.generate([default]), args.rounds)
    fixed_s = _best(lambda: gen.generate([one_step]), args.rounds)
    alone_s = _best(lambda: [gen.generate([r]) for r in reqs], args.rounds)
    batch_s = _best(lambda: gen.generate(reqs), args.rounds)
    results = [
        Result("image", "request s (default job)", request_s, fixed_s, "s", "about 1 s on a CPU", False),
        Result("image", "images/s (batched)", args.requests / batch_s, args.requests / alone_s, "images/s"),
    ]
    print_results(results)
    return results


if __name__ == "__main__":
    main()
