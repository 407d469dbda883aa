"""Lost messages (tasks.inflight + the reaper's lost_message rule): no job waits for a message
that is gone, and a healthy backlog is left alone.

A Redis consumer SIGKILLed between BRPOP and its `unacked` write leaves the message nowhere;
these tests leave exactly that behind (the message popped from its list by hand), and the
slow test in test_lost_messages_kill.py kills real workers in that window.
"""

from __future__ import annotations

import json
import time
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import update

from models import Job, JobStatus
from models.base import utcnow
from models.db import transaction
from tasks import inflight
from tasks.celery_app import create_celery
from tasks.contract import names
from tasks.contract.publish import publish_job
from tasks.contract.routing import REDIS_PRIORITY
from tasks.maintenance import SUSPECTS, reap
from tasks.runtime import runtime
from tests.support.jobs import create_job, event_rows, events, get, wait_done
from tests.support.workers import thread_workers

SEP = "\x06\x16"


def _list(priority: str = "normal", queue: str = names.TEXT_QUEUE) -> str:
    pri = REDIS_PRIORITY[priority]
    return f"{queue}{SEP}{pri}" if pri else queue


def _take(broker, key: str) -> dict:
    """What BRPOP does: the head of the list, gone from Redis and (if the taker dies) lost."""
    raw = broker.rpop(key)
    assert raw is not None, f"{key!r} is empty"
    return json.loads(raw)


def _after(seconds: float):
    return utcnow() + timedelta(seconds=seconds)


def _submit(sessions, app, modality: str = "text", priority: str = "normal") -> uuid.UUID:
    jid = create_job(sessions, modality)
    with transaction(sessions) as s:
        s.execute(update(Job).where(Job.id == jid).values(priority=priority, published_at=utcnow()))
    publish_job(app, jid, modality, priority)
    return jid


def test_a_message_taken_but_never_recorded_is_published_again(settings, sessions, broker):
    app = create_celery(settings, set_as_current=False)
    lost = _submit(sessions, app)
    others = [
        _submit(sessions, app),
        _submit(sessions, app, "video", "high"),
        _submit(sessions, app, "video", "low"),
    ]
    taken = _take(broker, _list("normal"))
    assert taken["headers"]["id"] == names.stage_task_id(str(lost), "text")
    rt = runtime(app)
    bound = settings.lost_message_after_s
    assert reap(rt, app) == {}
    assert reap(rt, app, now=_after(bound - 5)) == {}  # not yet: inside the bound
    # Past the bound: the lost one only; the others' messages are found in their lists.
    assert reap(rt, app, now=_after(bound + 1)) == {"requeued_lost_message": 1}
    assert reap(rt, app, now=_after(bound + 1)) == {}  # its new message is live
    with thread_workers(settings) as app:
        for jid in [lost, *others]:
            job = wait_done(sessions, jid)
            assert job.status == "succeeded"
            assert events(sessions, jid).count("job.succeeded") == 1
            assert events(sessions, jid).count("job.started") == 1
            assert job.recoveries == (1 if jid == lost else 0)
    [rec] = event_rows(sessions, lost, "job.recovered")
    assert rec.data == {"reason": "lost_message", "stage": "text", "recovery": 1}


def test_a_deep_healthy_backlog_is_not_republished(settings, sessions, broker):
    """Hours-old jobs whose messages are still queued are left alone, however many there are."""
    app = create_celery(settings, set_as_current=False)
    jobs = [_submit(sessions, app) for _ in range(SUSPECTS * 2 + 20)]
    hour_ago = utcnow() - timedelta(hours=1)  # they have waited an hour (inside queued_timeout_s)
    with transaction(sessions) as s:
        for i, jid in enumerate(jobs):
            at = hour_ago + timedelta(milliseconds=i)
            s.execute(update(Job).where(Job.id == jid).values(published_at=at))
    rt = runtime(app)
    assert reap(rt, app) == {}
    assert broker.llen(_list("normal")) == len(jobs)
    taken = _take(broker, _list("normal"))  # the oldest one's message goes missing
    assert reap(rt, app) == {"requeued_lost_message": 1}
    assert get(sessions, uuid.UUID(taken["headers"]["id"].split(".")[0])).recoveries == 1
    assert broker.llen(_list("normal")) == len(jobs)


def test_a_lost_video_message_is_published_again(settings, sessions, broker):
    """After the text stage the job waits for video; if that message is lost, it is sent again."""
    app = create_celery(settings, set_as_current=False)
    waiting = []
    for _ in range(2):
        jid = create_job(sessions)
        with transaction(sessions) as s:  # as complete_text leaves it
            s.execute(
                update(Job)
                .where(Job.id == jid)
                .values(
                    status=JobStatus.RUNNING, stage="video", attempts=0, output_text="Shot: a red fox",
                    started_at=utcnow(), text_completed_at=utcnow(), published_at=utcnow(), progress=20,
                    deadline_at=utcnow() + timedelta(seconds=settings.queued_timeout_s),
                )
            )  # fmt: skip
        waiting.append(jid)
    lost, live = waiting
    publish_job(app, live, "video", "normal", stage="video")  # only `live` has its message
    rt = runtime(app)
    bound = settings.lost_message_after_s
    assert reap(rt, app, now=_after(bound - 5)) == {}
    assert reap(rt, app, now=_after(bound + 1)) == {"requeued_lost_message": 1}
    with thread_workers(settings) as app:
        for jid in waiting:
            job = wait_done(sessions, jid)
            assert (job.status, job.attempts) == ("succeeded", 1)
            assert events(sessions, jid).count("job.succeeded") == 1
    assert get(sessions, lost).recoveries == 1 and get(sessions, live).recoveries == 0
    [rec] = event_rows(sessions, lost, "job.recovered")
    assert rec.data == {"reason": "lost_message", "stage": "video", "recovery": 1}


def test_a_message_held_by_a_consumer_that_died_before_starting_it(settings, sessions, broker):
    """Taken and recorded in `unacked`, then the consumer died: kombu would return it only after
    the visibility timeout (hours). Held past the bound, not started and no countdown: lost."""
    app = create_celery(settings, set_as_current=False)
    dead, fresh, countdown = (_submit(sessions, app) for _ in range(3))
    later = _after(settings.lost_message_after_s + 1)
    held_since = {
        dead: later.timestamp() - settings.lost_message_after_s - 60,
        fresh: later.timestamp() - 5,
        countdown: later.timestamp() - settings.lost_message_after_s - 60,
    }
    for _ in range(3):
        message = _take(broker, _list("normal"))
        jid = uuid.UUID(message["headers"]["id"].split(".")[0])
        if jid == countdown:  # a retry waiting for its ETA is held on purpose
            message["headers"]["eta"] = (later + timedelta(seconds=30)).isoformat()
        tag = uuid.uuid4().hex
        broker.hset("unacked", tag, json.dumps([message, "", names.TEXT_QUEUE]))
        broker.zadd("unacked_index", {tag: held_since[jid]})
    ids = [names.stage_task_id(str(j), "text") for j in (dead, fresh, countdown)]
    assert inflight.live_task_ids(app, names.TEXT_QUEUE, ids) == set(ids)  # no age limit: all there
    rt = runtime(app)
    assert reap(rt, app, now=later) == {"requeued_lost_message": 1}
    assert [get(sessions, j).recoveries for j in (dead, fresh, countdown)] == [1, 0, 0]
    broker.delete("unacked", "unacked_index")  # the dead consumer's leftovers, for a clean stop
    with thread_workers(settings) as app:
        assert wait_done(sessions, dead).status == "succeeded"


def test_the_check_costs_nothing_without_suspects_and_skips_rabbitmq(settings, sessions, broker, monkeypatch):
    """No job has waited the bound: the broker is not asked. On RabbitMQ (atomic delivery) the
    rule is off: a reaper run there neither connects for it nor republishes."""
    app = create_celery(settings, set_as_current=False)
    _submit(sessions, app)
    _take(broker, _list("normal"))
    asked: list[str] = []
    real = inflight.live_task_ids
    monkeypatch.setattr(
        inflight,
        "live_task_ids",
        lambda app, queue, *a, **kw: asked.append(queue) or real(app, queue, *a, **kw),
    )
    assert reap(runtime(app), app) == {}
    assert asked == []
    assert reap(runtime(app), app, now=_after(settings.lost_message_after_s + 1)) == {
        "requeued_lost_message": 1
    }
    assert asked == [names.TEXT_QUEUE]  # the one suspect's stage only
    amqp = settings.model_copy(update={"broker_url": "amqp://guest:guest@127.0.0.1:1//"})
    rabbit = create_celery(amqp, set_as_current=False)
    started = time.monotonic()
    assert reap(runtime(rabbit), rabbit, now=_after(settings.lost_message_after_s + 1)) == {}
    assert time.monotonic() - started < 5  # no connection attempts to the (absent) broker
    assert asked == [names.TEXT_QUEUE]  # the job is a suspect again by then, but not asked about
    assert not inflight.supported(amqp.broker_url) and inflight.supported(settings.broker_url)


def test_a_lost_message_of_a_stage_the_reaper_sent_again_is_sent_again(settings, sessions, broker):
    """The reaper republished an overdue stage (deadline now queued_timeout_s ahead) and that
    message was lost too; a job inside its stage (short deadline, no message) is left alone."""
    app = create_celery(settings, set_as_current=False)
    republished, inside = create_job(sessions, "text"), create_job(sessions, "text")
    deadlines = {republished: settings.queued_timeout_s, inside: settings.text_time_limit_s}
    for jid, seconds in deadlines.items():
        with transaction(sessions) as s:
            s.execute(
                update(Job)
                .where(Job.id == jid)
                .values(
                    status=JobStatus.RUNNING, stage="text", attempts=1, recoveries=1, started_at=utcnow(),
                    published_at=utcnow(), deadline_at=utcnow() + timedelta(seconds=seconds),
                )
            )  # fmt: skip
    rt = runtime(app)
    assert reap(rt, app, now=_after(settings.lost_message_after_s - 5)) == {}
    assert reap(rt, app, now=_after(settings.lost_message_after_s + 1)) == {"requeued_lost_message": 1}
    assert [get(sessions, j).recoveries for j in (republished, inside)] == [2, 1]
    with thread_workers(settings) as app:
        job = wait_done(sessions, republished)
    assert (job.status, job.attempts) == ("succeeded", 2)
    assert events(sessions, republished).count("job.succeeded") == 1


@pytest.mark.slow
def test_scanning_a_full_backlog_is_cheap(settings, sessions, broker):
    """The worst case per reaper run: admission's cap of 10,000 waiting text messages and 50
    suspects none of which is there (every list read to its end). Prints the measured cost."""
    app = create_celery(settings, set_as_current=False)
    publish_job(app, uuid.uuid4(), "video", "normal")
    template = broker.rpop(_list("normal")).decode()
    real_id = json.loads(template)["headers"]["id"]
    pipe = broker.pipeline(transaction=False)
    for _ in range(10_000):
        pipe.lpush(_list("normal"), template.replace(real_id, f"{uuid.uuid4()}.text"))
    pipe.execute()
    absent = [f"{uuid.uuid4()}.text" for _ in range(SUSPECTS)]
    head = [json.loads(m)["headers"]["id"] for m in broker.lrange(_list("normal"), -SUSPECTS, -1)]
    timings = {}
    for name, ids, expect in (("absent", absent, set()), ("at the head", head, set(head))):
        started = time.perf_counter()
        assert inflight.live_task_ids(app, names.TEXT_QUEUE, ids) == expect
        timings[name] = time.perf_counter() - started
    size = broker.memory_usage(_list("normal")) or 0
    print(
        f"10,000 messages ({size / 1e6:.0f} MB), {SUSPECTS} suspects: "
        + ", ".join(f"{k} {v * 1000:.0f} ms" for k, v in timings.items())
        + f" ({10_000 // inflight.CHUNK} Lua calls)"
    )
    assert timings["absent"] < 2.0
