"""Result-cache benchmark: a cache hit vs a normal submit, side by side in one run.

    PYTHONPATH=$PWD python bench/cache.py [--model smollm2] [--n 30]

Through the real API (Flask app in this process, the real Postgres and Redis) and a real text
worker (the Procfile's command, a subprocess):
  submit   POST /v1/jobs latency: a normal submit (insert, publish, update) vs a cache hit
           (keyed select, insert; no publish), median of --n each;
  result   time from POST to a finished job: a normal job through the worker vs a cache hit
           (finished in the POST itself), median of --n each (--n/5 worker runs for the baseline).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

try:  # run as a script (python bench/cache.py): its folder comes first on sys.path
    from batching import bench_env, worker
except ImportError:  # run as a module (python -m bench.cache)
    from bench.batching import bench_env, worker
from bench.common import auth_headers, bench_key


def _post(client, prompt: str, seed: int, cache: bool = True) -> tuple[float, dict]:
    params = {"seed": seed, "max_new_tokens": 48}
    body = {"prompt": prompt, "modality": "text", "params": params, "cache": cache}
    started = time.perf_counter()
    resp = client.post("/v1/jobs", json=body)
    elapsed = time.perf_counter() - started
    if resp.status_code not in (200, 202):
        raise SystemExit(f"submit failed: {resp.status_code} {resp.get_data(as_text=True)}")
    return elapsed, resp.get_json()


def _until_done(client, job_id: str, timeout: float = 900) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        job = client.get(f"/v1/jobs/{job_id}").get_json()
        if job["status"] in ("succeeded", "failed", "canceled"):
            if job["status"] != "succeeded":
                raise SystemExit(f"job {job_id} {job['status']}: {job['error']}")
            return job
        time.sleep(0.01)
    raise SystemExit(f"job {job_id} did not finish")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2")
    ap.add_argument("--n", type=int, default=30)
    args = ap.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from app import create_app
    from models.settings import Settings

    load = os.getloadavg()[0]
    print(f"# cache: model={args.model} n={args.n} cpus={os.cpu_count()} load={load:.2f}", flush=True)
    with bench_env() as env:
        settings = Settings(
            database_url=env.database_url, broker_url=env.broker_url, artifact_dir=env.artifact_dir,
            text_model=args.model,
        )  # fmt: skip
        client = create_app(settings).test_client()
        # A key whose plan has no practical rate limit: the hits come faster than the default allows.
        client.environ_base.update(HTTP_AUTHORIZATION=auth_headers(bench_key(env.database_url))["Authorization"])
        log = env.artifact_dir / "worker.log"
        extra = {"GENQUEUE_TEXT_MODEL": args.model, "GENQUEUE_WORKER_PRELOAD": "text"}
        with worker(env, "text", 8, log, **extra):
            _until_done(client, _post(client, "warm up", 0, cache=False)[1]["id"])
            source = _until_done(client, _post(client, "a red fox in the snow", 1)[1]["id"])
            # Submit latency: many normal submits (unique seeds, computed later) vs many hits.
            submitted = [_post(client, "a red fox in the snow", 1000 + i) for i in range(args.n)]
            normal = [elapsed for elapsed, _ in submitted]
            hits = []
            for _ in range(args.n):
                elapsed, job = _post(client, "a red fox in the snow", 1)
                assert job["cached"] and job["status"] == "succeeded" and job["source_job_id"] == source["id"]
                hits.append(elapsed)
            for _, job in submitted:  # drain the backlog before timing whole jobs
                _until_done(client, job["id"])
            rounds = max(1, args.n // 5)
            computed = []
            for i in range(rounds):
                started = time.perf_counter()
                _until_done(client, _post(client, "a lighthouse in a storm", 9000 + i)[1]["id"])
                computed.append(time.perf_counter() - started)
    med = statistics.median
    print(f"submit  normal POST {med(normal) * 1000:8.2f} ms   cache-hit POST {med(hits) * 1000:8.2f} ms   "
          f"ratio {med(normal) / med(hits):6.2f}x", flush=True)  # fmt: skip
    print(f"result  normal job  {med(computed) * 1000:8.1f} ms   cache hit      {med(hits) * 1000:8.2f} ms   "
          f"ratio {med(computed) / med(hits):6.0f}x faster", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
