"""Dynamic batching: grouping, limits, per-request failure isolation and deadlines, then a real worker."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any, ClassVar

import pytest
from celery.exceptions import SoftTimeLimitExceeded

from models import Job
from models.db import transaction
from tasks.batching import Item, MicroBatcher
from tasks.contract.publish import publish_job
from tasks.generators.base import (
    InvalidRequest,
    TextGenerator,
    TextRequest,
    TextResult,
    TransientGeneratorError,
    VideoGenerator,
)
from tests.support.jobs import wait_all_done
from tests.support.procs import wait_for
from tests.support.workers import in_process_worker


class Recorder:
    """A run function that records each call's requests; "boom" sinks the whole call.

    Each call takes `delay` seconds (simulated compute) or, with `hold`, until it is set.
    """

    def __init__(self, delay: float = 0.0, hold: threading.Event | None = None) -> None:
        self.calls: list[list[Any]] = []
        self.delay, self.hold = delay, hold
        self.lock = threading.Lock()

    def __call__(self, batch: list[Item]) -> list[str]:
        reqs = [i.request for i in batch]
        with self.lock:
            self.calls.append(reqs)
        if self.hold is not None:
            assert self.hold.wait(30), "the test never released the running batch"
        time.sleep(self.delay)
        if "boom" in reqs:
            raise TransientGeneratorError("one bad request sank the call")
        return [f"done:{r}" for r in reqs]


def _submit_all(batcher: MicroBatcher, reqs: Sequence[Any], **kw: Any) -> dict[Any, Any]:
    """Submit each request from its own thread (as concurrent tasks do); request -> result or error."""
    out: dict[Any, Any] = {}

    def one(req: Any) -> None:
        try:
            deadline = time.monotonic() + kw.get("timeout", 10)
            out[req] = batcher.submit(req, deadline=deadline, **kw.get("extra", {}))
        except BaseException as exc:
            out[req] = exc

    threads = [threading.Thread(target=one, args=(r,)) for r in reqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(15)
    return out


def test_expected_callers_share_one_call_and_get_their_own_results() -> None:
    run = Recorder()
    batcher = MicroBatcher("t", run, max_size=8, max_wait_s=5)
    for _ in range(8):
        batcher.expect()  # eight tasks started: the collector waits for all of them
    out = _submit_all(batcher, range(8), extra={"expected": True})
    assert out == {i: f"done:{i}" for i in range(8)}
    assert [sorted(c) for c in run.calls] == [list(range(8))]


def test_batches_never_exceed_max_size() -> None:
    run = Recorder(delay=0.05)
    batcher = MicroBatcher("t", run, max_size=3, max_wait_s=0.2)
    for _ in range(10):
        batcher.expect()
    out = _submit_all(batcher, range(10), extra={"expected": True})
    assert out == {i: f"done:{i}" for i in range(10)}
    assert sorted(r for c in run.calls for r in c) == list(range(10))
    assert max(len(c) for c in run.calls) == 3


def test_max_size_one_runs_one_at_a_time() -> None:
    run = Recorder(delay=0.01)
    batcher = MicroBatcher("t", run, max_size=1, max_wait_s=1)
    out = _submit_all(batcher, range(5))
    assert len(out) == 5 and all(len(c) == 1 for c in run.calls) and len(run.calls) == 5


def test_a_lone_request_waits_at_most_max_wait_for_company() -> None:
    run = Recorder()
    batcher = MicroBatcher("t", run, max_size=8, max_wait_s=0.05)
    batcher.expect()
    batcher.expect()  # the second caller never comes
    started = time.monotonic()
    assert batcher.submit("a", deadline=time.monotonic() + 10, expected=True) == "done:a"
    assert time.monotonic() - started < 3  # max_wait, not the deadline
    batcher.unexpect()


def test_one_bad_request_does_not_fail_its_batch_mates() -> None:
    run = Recorder()
    batcher = MicroBatcher("t", run, max_size=8, max_wait_s=5)
    reqs = ["a", "boom", "b", "c"]
    for _ in reqs:
        batcher.expect()
    out = _submit_all(batcher, reqs, extra={"expected": True})
    assert isinstance(out["boom"], TransientGeneratorError)
    assert {k: out[k] for k in "abc"} == {"a": "done:a", "b": "done:b", "c": "done:c"}
    assert sorted(run.calls[0]) == sorted(reqs)  # tried together first, then each alone
    assert sorted(map(tuple, run.calls[1:])) == [("a",), ("b",), ("boom",), ("c",)]


def _probe(batcher: MicroBatcher) -> None:
    """Run one more request to its end: the collector takes requests in order, so everything
    submitted before it has by then been run or dropped."""
    assert batcher.submit("probe", deadline=time.monotonic() + 10) == "done:probe"


def test_a_caller_past_its_deadline_times_out_alone() -> None:
    hold = threading.Event()
    run = Recorder(hold=hold)
    batcher = MicroBatcher("t", run, max_size=8, max_wait_s=0.01)
    out: dict[str, Any] = {}

    def slow() -> None:
        out["slow"] = batcher.submit("slow", deadline=time.monotonic() + 30)

    t = threading.Thread(target=slow)
    t.start()
    wait_for(lambda: run.calls == [["slow"]], 10, 0.01, "the slow batch to start")
    # "slow" runs until released; the next one queues behind it with a short deadline.
    with pytest.raises(SoftTimeLimitExceeded):
        batcher.submit("late", deadline=time.monotonic() + 0.1)
    hold.set()
    t.join(10)
    assert out["slow"] == "done:slow"
    _probe(batcher)
    assert not any("late" in call for call in run.calls)  # dropped before its batch started


def test_cancel_while_waiting_leaves_the_batch() -> None:
    from tasks.generators.base import Canceled

    hold = threading.Event()
    run = Recorder(hold=hold)
    batcher = MicroBatcher("t", run, max_size=1, max_wait_s=0)
    first = threading.Thread(target=lambda: batcher.submit("first", deadline=time.monotonic() + 30))
    first.start()
    wait_for(lambda: run.calls == [["first"]], 10, 0.01, "the first batch to start")
    # "second" waits behind the running one (max_size 1) until its cancel check says stop.
    with pytest.raises(Canceled):
        batcher.submit("second", deadline=time.monotonic() + 30, should_cancel=lambda: True)
    hold.set()
    first.join(10)
    _probe(batcher)
    assert run.calls == [["first"], ["probe"]]  # the canceled request never ran


def test_requests_of_different_shapes_are_not_mixed() -> None:
    run = Recorder()
    batcher = MicroBatcher("t", run, max_size=8, max_wait_s=5, key=lambda r: r[0])
    reqs = ["a1", "b1", "a2", "b2", "a3"]
    for _ in reqs:
        batcher.expect()
    _submit_all(batcher, reqs, extra={"expected": True})
    assert sorted(sorted(c) for c in run.calls) == [["a1", "a2", "a3"], ["b1", "b2"]]


# --- through a real worker ----------------------------------------------------------------------


class RecordingText(TextGenerator):
    """A text adapter that records every batch it runs; markers as in the echo adapter."""

    name = "recording"
    version = "recording@1"
    calls: ClassVar[list[list[str]]] = []

    def check_inputs(self, request: TextRequest) -> None:
        super().check_inputs(request)
        if "[[fail]]" in request.prompt:
            raise InvalidRequest("bad prompt")

    def run_batch(
        self, requests: Sequence[TextRequest], should_cancel: Any = None, on_step: Any = None
    ) -> list[TextResult]:
        RecordingText.calls.append([r.prompt for r in requests])
        time.sleep(0.2)  # long enough for the next tasks to pile up behind a running batch
        if any("[[transient]]" in r.prompt for r in requests):
            raise TransientGeneratorError("transient")
        return [TextResult(f"Shot: {r.prompt}", 2, 0.2) for r in requests]


@pytest.fixture
def batching_worker(settings, sessions, broker):
    """A worker configured as the text worker in production: threads pool, 8 executions."""
    from tasks.celery_app import create_celery

    app = create_celery(
        settings.model_copy(
            # A generous max_wait: on a busy test machine messages trickle in, and this test is
            # about grouping and isolation, not about the wait policy (unit-tested above).
            update={
                "text_model": f"{__name__}:RecordingText",
                "text_batch_max_size": 8,
                "text_batch_max_wait_ms": 3000,
            }
        ),
        set_as_current=False,
    )
    RecordingText.calls.clear()

    def start() -> Any:
        return in_process_worker(app, concurrency=8)

    return app, start


def test_worker_batches_concurrent_jobs_and_isolates_failures(batching_worker, sessions) -> None:
    app, start = batching_worker
    prompts = [f"scene {i}" for i in range(6)] + ["please [[fail]]", "flaky [[transient]]"]
    ids = []
    params = {"width": 32, "height": 32, "num_frames": 1, "steps": 1}
    for p in prompts:  # all queued before the worker starts, as under load
        with transaction(sessions) as s:
            job = Job(modality="video", prompt=p, params=params)
            s.add(job)
        ids.append(job.id)
        publish_job(app, job.id, "video", "normal")
    with start():
        jobs = wait_all_done(sessions, ids)
    by_prompt = {jobs[i].prompt: jobs[i] for i in ids}
    for i in range(6):
        job = by_prompt[f"scene {i}"]
        # Each job kept its own chain: text from the shared call, then its own video stage.
        assert (job.status, job.output_text) == ("succeeded", f"Shot: scene {i}"), job.error_message
        assert job.artifact_path is not None
    assert (by_prompt["please [[fail]]"].status, by_prompt["please [[fail]]"].error_code) == (
        "failed",
        "invalid_request",
    )
    flaky = by_prompt["flaky [[transient]]"]
    assert (flaky.status, flaky.error_code) == ("failed", "transient_failure")
    assert flaky.attempts == 1 + 3  # its own retries: the first try plus max_retries
    assert max(len(c) for c in RecordingText.calls) >= 4, RecordingText.calls  # grouped, not one by one


class RecordingVideo(VideoGenerator):
    """A video adapter that records each call's prompts and reports every step of every request."""

    name = "recording"
    version = "recording@1"
    calls: ClassVar[list[list[str]]] = []
    steps: ClassVar[list[tuple[int, int]]] = []

    def run_batch(self, requests: Sequence[Any], on_step: Any = None, should_cancel: Any = None) -> list[Any]:
        import numpy as np

        from tasks.generators.base import VideoResult

        RecordingVideo.calls.append([r.prompt for r in requests])
        time.sleep(0.2)
        for idx, req in enumerate(requests):
            for step in range(1, req.steps + 1):
                if on_step is not None:
                    on_step(idx, step, req.steps)
        return [
            VideoResult(np.zeros((r.num_frames, r.height, r.width, 3), dtype=np.uint8), r.fps, 0.2)
            for r in requests
        ]


def test_worker_batches_video_jobs_of_the_same_shape(settings, sessions, broker) -> None:
    from tasks.celery_app import create_celery
    from tasks.contract import names

    app = create_celery(
        settings.model_copy(
            update={
                "video_model": f"{__name__}:RecordingVideo",
                "video_batch_max_size": 4,
                "video_batch_max_wait_ms": 3000,
            }
        ),
        set_as_current=False,
    )
    RecordingVideo.calls.clear()
    shapes = {"small": {"width": 64, "height": 64}, "wide": {"width": 128, "height": 64}}
    prompts = {"small a": "small", "small b": "small", "small c": "small", "wide a": "wide"}
    ids = []
    for prompt, shape in prompts.items():  # jobs whose text stage is done, waiting for video
        params = {**shapes[shape], "num_frames": 1, "fps": 1, "steps": 2}
        with transaction(sessions) as s:
            job = Job(modality="video", prompt=prompt, params=params, status="running", stage="video",
                      output_text=prompt)  # fmt: skip
            s.add(job)
        ids.append(job.id)
        app.signature(names.GENERATE_VIDEO, args=(str(job.id),), immutable=True).apply_async()
    with in_process_worker(app, queues=[names.VIDEO_QUEUE]):
        jobs = wait_all_done(sessions, ids)
    assert all(j.status == "succeeded" and j.artifact_path for j in jobs.values())
    assert sorted(sorted(c) for c in RecordingVideo.calls) == [["small a", "small b", "small c"], ["wide a"]]
