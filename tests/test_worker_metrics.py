"""Workers' own metrics: real worker processes with a metrics port, scraped over HTTP.

A threads-pool worker (as the Procfile's text and default workers) counts the stages, outcomes,
a retry and a coalesced cache follower of the jobs it ran; a prefork worker (as the video
worker) serves what its pool children recorded from its main process. No GPU here: the GPU
gauges must be absent, not zero.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from models import Job, cache
from models.db import transaction
from tests.support.jobs import submit, wait_all_done
from tests.support.procs import Worker, free_port, wait_for, worker_env

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(port: int) -> Samples:
    """Every sample of the endpoint, keyed by (sample name, labels)."""
    body = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text
    return {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(body)
        for s in family.samples
    }


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def wait_metrics(port: int, expected: dict[tuple[str, frozenset[tuple[str, str]]], float]) -> Samples:
    """The scrape once it shows `expected` (a terminal transition is counted right after its commit)."""
    last: list[Samples] = [{}]

    def check() -> bool:
        last[0] = scrape(port)
        return all(last[0].get(key, 0.0) == want for key, want in expected.items())

    try:
        wait_for(check, 20, 0.1, "the expected metrics")
    except AssertionError:
        got = {key: last[0].get(key, 0.0) for key in expected}
        raise AssertionError(f"metrics: expected {expected}, got {got}") from None
    return last[0]


def key(name: str, **labels: str) -> tuple[str, frozenset[tuple[str, str]]]:
    return name, frozenset(labels.items())


@pytest.fixture
def metrics_worker(settings, tmp_path: Path) -> Iterator[Callable[..., tuple[int, Worker]]]:
    started: list[Worker] = []

    def start(queues: str, pool: str, concurrency: int, **env: str) -> tuple[int, Worker]:
        port = free_port()
        files = tmp_path / "m" / str(port)
        files.mkdir(parents=True)
        (files / "counter_1.db").write_bytes(b"left by an earlier run")  # would break the scrape
        extra = {
            "GENQUEUE_WORKER_METRICS_PORT": str(port),
            "GENQUEUE_WORKER_METRICS_DIR": str(tmp_path / "m"),
        }
        # `genqueue worker`, as the Procfile runs it: it gives the worker its metrics directory.
        env = worker_env(settings, **extra, **env)
        started.append(Worker(env, queues, tmp_path, pool, pool, concurrency, supervised=True).start())
        assert not (files / "counter_1.db").exists()  # emptied at start
        return port, started[-1]

    yield start
    for w in started:
        w.stop()


def _follower_of(sessions, settings, prompt: str) -> tuple[uuid.UUID, uuid.UUID]:
    """A queued source job with a cache key and an identical job coalesced onto it (as the API
    does for a second identical submit while the first is queued)."""
    params = {"seed": 1}
    with transaction(sessions) as s:
        source = Job(modality="text", prompt=prompt, params=params)
        source.cache_key = cache.cache_key(settings, "text", prompt, params)
        s.add(source)
        s.flush()
        follower = Job(modality="text", prompt=prompt, params=params)
        cache.attach(s, follower, source)
        s.flush()
        return source.id, follower.id


def test_a_threads_worker_counts_its_stages_outcomes_retries_and_followers(
    settings, sessions, broker, celery_app, metrics_worker
) -> None:
    from tasks.contract.publish import publish_job

    gen = "tests.support.generators"
    port, _ = metrics_worker("text,video,default", "threads", 4, GENQUEUE_TEXT_MODEL=f"{gen}:FlakyText")
    # Nothing ran yet: only the queues its consumer reads (set once the consumer is ready).
    queues = {key("genqueue_worker_consuming", queue=q): 1 for q in ("text", "video", "default")}
    consuming = wait_metrics(port, queues)
    assert {name for name, _ in consuming if name.startswith("genqueue_")} == {"genqueue_worker_consuming"}

    # Alone, so its failure is its own (in a batch, the batch-mates' rerun one by one would cover it).
    flaky = submit(sessions, celery_app, "text", "a [[flaky:1]] fox")
    wait_all_done(sessions, [flaky])
    ok = [submit(sessions, celery_app, "text", f"fox {i}") for i in range(2)]
    video = submit(sessions, celery_app, "video", "a red fox")
    bad = submit(sessions, celery_app, "text", "too long", max_new_tokens=5000)
    source, follower = _follower_of(sessions, settings, "a cached fox")
    publish_job(celery_app, source, "text", "normal")
    jobs = wait_all_done(sessions, [*ok, flaky, video, bad, source, follower], timeout=60)
    assert [jobs[j].status for j in (*ok, flaky, video, source, follower)] == ["succeeded"] * 6
    assert (jobs[bad].status, jobs[bad].error_code) == ("failed", "invalid_request")

    text_jobs = 6  # every job but the follower enters the text stage once (the retry is not a wait)
    samples = wait_metrics(
        port,
        {
            key("genqueue_queue_wait_seconds_count", stage="text"): text_jobs,
            key("genqueue_queue_wait_seconds_count", stage="video"): 1,
            key("genqueue_stage_duration_seconds_count", stage="text"): text_jobs - 1,  # not the bad one
            key("genqueue_stage_duration_seconds_count", stage="video"): 1,
            key("genqueue_jobs_finished_total", status="succeeded", error_code="none"): 5,
            key("genqueue_jobs_finished_total", status="failed", error_code="invalid_request"): 1,
            key("genqueue_job_duration_seconds_count", status="succeeded"): 5,
            key("genqueue_job_duration_seconds_count", status="failed"): 1,
            key("genqueue_stage_retries_total", stage="text", reason="transient_failure"): 1,
            key("genqueue_cache_followers_finished_total", status="succeeded"): 1,
            key("genqueue_compensations_total", status="failed"): 1,
            key("genqueue_batch_size_sum", stage="video"): 1,
            key("genqueue_model_load_seconds_count", stage="text"): 1,
            key("genqueue_model_load_seconds_count", stage="video"): 1,
        },
    )
    # Every text request went through generate(), the flaky one twice (a batch that raised is
    # run again one by one, so there may be more).
    assert value(samples, "genqueue_batch_size_sum", stage="text") >= text_jobs + 1
    assert value(samples, "genqueue_generator_busy_seconds_total", stage="text") > 0
    total = value(samples, "genqueue_job_duration_seconds_sum", status="succeeded")
    assert total >= value(samples, "genqueue_stage_duration_seconds_sum", stage="video")
    assert not [name for name, _ in samples if name.startswith("genqueue_gpu_")]  # absent on CPU


@pytest.mark.slow
def test_a_prefork_worker_serves_its_childrens_metrics(
    settings, sessions, broker, celery_app, metrics_worker
) -> None:
    port, worker = metrics_worker("text,video", "prefork", 2)  # the main process runs no task itself
    ids = [submit(sessions, celery_app, "video", f"fox {i}") for i in range(3)]
    jobs = wait_all_done(sessions, ids, timeout=90)
    assert {j.status for j in jobs.values()} == {"succeeded"}
    samples = wait_metrics(
        port,
        {
            key("genqueue_stage_duration_seconds_count", stage="text"): 3,
            key("genqueue_stage_duration_seconds_count", stage="video"): 3,
            key("genqueue_jobs_finished_total", status="succeeded", error_code="none"): 3,
            key("genqueue_job_duration_seconds_count", status="succeeded"): 3,
        },
    )
    # Each child loads its own models: one or two of them did.
    assert 1 <= value(samples, "genqueue_model_load_seconds_count", stage="video") <= 2
    assert not [name for name, _ in samples if name.startswith("genqueue_gpu_")]

    # A child killed (the OOM killer, say) is replaced; what it counted stays in the totals.
    [celery_main] = worker.pool_children()  # under the supervisor
    victim = celery_main.children()[0]
    victim.kill()

    def replaced() -> bool:
        pids = {c.pid for c in celery_main.children()}
        return victim.pid not in pids and len(pids) == 2

    wait_for(replaced, 30, 0.2, "the pool to replace its child")
    assert scrape(port) == samples
    # Only the main process listens: a child outliving it must not keep the port from a restart.
    for child in celery_main.children():
        assert port not in {c.laddr.port for c in child.net_connections("tcp") if c.status == "LISTEN"}


def test_the_gpu_gauges_exist_only_with_cuda_one_sample_per_device(monkeypatch) -> None:
    torch = pytest.importorskip("torch")
    from tasks.generators import gpu
    from tasks.metrics import metrics

    def gpu_samples() -> dict[tuple[str, str], float]:
        return {
            (s.name, s.labels["device"]): s.value
            for family in metrics().registry.collect()
            for s in family.samples
            if s.name.startswith("genqueue_gpu_")
        }

    if torch.cuda.is_available():
        pytest.skip("fakes CUDA devices on a machine without any")
    assert gpu.watch() is False
    assert gpu_samples() == {}  # absent, not zero
    # Two devices as torch reports them, without nvidia-ml-py (no utilisation then).
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda i: 1000 + i)
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda i: 2000 + i)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda i: SimpleNamespace(total_memory=9000 + i))
    monkeypatch.setattr(gpu, "_nvml_missing", False)

    def no_nvml(_index: int) -> int:
        raise ModuleNotFoundError("pynvml does not seem to be installed")

    monkeypatch.setattr(torch.cuda, "utilization", no_nvml)
    gpu.sample()
    assert gpu_samples() == {
        ("genqueue_gpu_memory_allocated_bytes", "0"): 1000,
        ("genqueue_gpu_memory_allocated_bytes", "1"): 1001,
        ("genqueue_gpu_memory_reserved_bytes", "0"): 2000,
        ("genqueue_gpu_memory_reserved_bytes", "1"): 2001,
        ("genqueue_gpu_memory_total_bytes", "0"): 9000,
        ("genqueue_gpu_memory_total_bytes", "1"): 9001,
    }
    monkeypatch.setattr(torch.cuda, "utilization", lambda i: 40 + i)
    monkeypatch.setattr(gpu, "_nvml_missing", False)
    gpu.sample()
    assert gpu_samples()[("genqueue_gpu_utilization_percent", "1")] == 41
