"""Group commit of concurrent submits (app.submit_groups) against the real Postgres and Redis."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable
from typing import Any

import redis
from sqlalchemy import func, select

from app import submission
from models import Job
from tests.support.api import assert_problem, authed_client_class, make_api_key, submit
from tests.support.jobs import broker_messages


def job_ids(sessions) -> list[uuid.UUID]:
    with sessions() as s:
        return list(s.scalars(select(Job.id)))


def concurrently(app, key: str, n: int, bodies: list[dict[str, Any]] | None = None, **body: Any) -> list[Any]:
    """n submits at once from n threads (each its own client, `bodies[i]` or `body`); their
    responses, or the exception a request raised."""
    barrier, responses = threading.Barrier(n), [None] * n

    def one(i: int) -> None:
        client = authed_client_class(key)(app, app.response_class, True)
        barrier.wait()
        try:
            responses[i] = submit(client, **(bodies[i] if bodies else body))
        except BaseException as exc:  # the test looks at it (a killed request)
            responses[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    return responses


def slow_first(monkeypatch, name: str, then: Callable[..., Any] | None = None) -> list[int]:
    """Wrap app.submission.<name> (record or send): the first call waits, so the submits that
    arrive meanwhile queue behind it; returns the jobs per call."""
    original, sizes = getattr(submission, name), []

    def wrapped(subs, *args: Any, **kwargs: Any) -> Any:
        sizes.append(len(subs))
        if len(sizes) == 1:
            time.sleep(0.5)
        return (then or original)(subs, *args, **kwargs)

    monkeypatch.setattr(submission, name, wrapped)
    return sizes


def test_concurrent_submits_are_committed_and_published_in_groups(app, sessions, broker, monkeypatch):
    sizes = slow_first(monkeypatch, "record")
    key = make_api_key(sessions, "acme")
    responses = concurrently(app, key, 8)
    assert [r.status_code for r in responses] == [202] * 8
    # The first went alone; the rest queued behind it and went together, in fewer writes.
    assert sum(sizes) == 8 and sizes[0] == 1 and max(sizes) > 1 and len(sizes) < 8
    answered = sorted(uuid.UUID(r.get_json()["id"]) for r in responses)
    assert sorted(job_ids(sessions)) == answered  # every job once
    messages = broker_messages(broker, "text")
    sent = sorted(uuid.UUID(m["headers"]["id"].removesuffix(".text")) for m in messages)
    assert sent == answered  # one message each, published after its group's commit


def test_a_group_holds_at_most_submit_group_max(make_app, sessions, monkeypatch):
    app = make_app(submit_group_max=2)
    sizes = slow_first(monkeypatch, "record")
    responses = concurrently(app, make_api_key(sessions, "acme"), 7)
    assert [r.status_code for r in responses] == [202] * 7
    assert sum(sizes) == 7 and max(sizes) == 2


def test_a_failed_group_publish_fails_each_submit_and_keeps_nothing(app, sessions, broker, monkeypatch):
    def broker_down(*args: Any, **kwargs: Any) -> None:
        raise redis.exceptions.ConnectionError("broker down")

    monkeypatch.setattr(submission, "publish_jobs", broker_down)
    sizes = slow_first(monkeypatch, "send")
    key = make_api_key(sessions, "acme", max_active_jobs=6)
    responses = concurrently(app, key, 6)
    for resp in responses:
        assert "queue" in assert_problem(resp, 503)["detail"]
    assert max(sizes) > 1  # the failure reached submits of a group, not only a lone one
    assert job_ids(sessions) == [] and broker_messages(broker, "text") == []
    # Each gave its quota slot back: the tenant's six slots are all free again.
    monkeypatch.undo()
    responses = concurrently(app, key, 6)
    assert [r.status_code for r in responses] == [202] * 6


def test_submits_with_an_idempotency_key_or_group_max_1_go_alone(make_app, sessions, monkeypatch):
    def no_groups(*args: Any, **kwargs: Any) -> None:
        raise AssertionError("went through app.submit_groups")

    monkeypatch.setattr("app.submit_groups.SubmitGroups.submit", no_groups)
    client = make_app().test_client()
    body = {"prompt": "a fox", "modality": "text"}
    assert client.post("/v1/jobs", json=body, headers={"Idempotency-Key": "k-1"}).status_code == 202
    assert submit(make_app(submit_group_max=1).test_client()).status_code == 202
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 2


def test_one_bad_row_fails_its_own_submit_only(app, sessions, monkeypatch):
    """A non-transient failure of a group's INSERT retries its submits one by one: only the job
    whose row cannot be written fails."""
    bad_groups: list[int] = []
    original = submission.record

    def record(subs, *args: Any, **kwargs: Any) -> Any:
        if any(sub.job.prompt == "bad" for sub in subs):
            bad_groups.append(len(subs))
            raise ValueError("this row cannot be written")
        return original(subs, *args, **kwargs)

    slow_first(monkeypatch, "record", then=record)
    key = make_api_key(sessions, "acme")
    first = threading.Thread(target=concurrently, args=(app, key, 1))
    first.start()  # alone, and slow: the next five queue behind it as one group
    time.sleep(0.1)
    bodies = [{"prompt": "bad" if i == 3 else f"good {i}"} for i in range(5)]
    responses = concurrently(app, key, 5, bodies)
    first.join(30)
    assert bad_groups[0] == 5 and bad_groups[1:] == [1]  # the group, then the bad job alone
    assert [r.status_code for r in responses] == [202, 202, 202, 500, 202]
    assert len(job_ids(sessions)) == 5


class Killed(BaseException):
    """A request killed in the middle (gevent's GreenletExit at a worker's shutdown, say)."""


def test_submits_committed_before_their_writer_was_killed_are_accepted(app, sessions, broker, monkeypatch):
    calls: list[int] = []
    original_send = submission.send

    def send(jobs, *args: Any, **kwargs: Any) -> None:
        calls.append(len(jobs))
        if len(calls) == 1:  # the first group, alone
            return original_send(jobs, *args, **kwargs)
        raise Killed  # the second group's writer, after its commit, before any publish

    sizes = slow_first(monkeypatch, "record")
    monkeypatch.setattr(submission, "send", send)
    responses = concurrently(app, make_api_key(sessions, "acme"), 5)
    killed = [r for r in responses if isinstance(r, Killed)]
    assert len(killed) == 1 and sizes[1] == 4
    # The writer's three neighbours were committed: accepted (the reaper publishes them).
    assert sorted(r.status_code for r in responses if not isinstance(r, Killed)) == [202] * 4
    assert len(job_ids(sessions)) == 5 and len(broker_messages(broker, "text")) == 1


def test_a_submit_that_stops_waiting_leaves_the_queue_to_the_next():
    """A queued submit chosen to write next but killed before it could: the one after it writes
    instead, or nobody is writing; a later submit must never wait forever."""
    from app.submit_groups import SubmitGroups, _Entry

    groups = SubmitGroups(8)
    dead, alive = _Entry(sub=None), _Entry(sub=None)  # type: ignore[arg-type]
    groups._writing, groups._queue, dead.lead = True, [dead, alive], True
    groups._abandon(dead)
    assert groups._queue == [alive] and alive.lead and alive.woken.is_set() and groups._writing
    groups._queue = [dead]
    groups._abandon(dead)
    assert groups._queue == [] and not groups._writing
