"""Rate limits, concurrency quota, plans and admission control against the real Postgres and Redis."""

from __future__ import annotations

import threading
import time
import uuid
from datetime import timedelta
from typing import Any

import pytest
from sqlalchemy import func, select

from app.admission import admission
from models import Job, JobStatus, states
from models.base import utcnow
from models.db import transaction
from tests.support.api import assert_problem, authed_client_class, make_api_key, submit


def job_count(sessions) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(Job)) or 0


def add_jobs(sessions, n: int, **fields: Any) -> list[Job]:
    jobs = [Job(**({"modality": "text", "prompt": "p", "params": {}} | fields)) for _ in range(n)]
    with transaction(sessions) as s:
        s.add_all(jobs)
    return jobs


# --- rate limits ---------------------------------------------------------------------------------


def test_burst_limit_answers_429_with_headers(tenant_client):
    client = tenant_client("acme", rate_limit="3/second;100/minute")
    seen = []
    for _ in range(3):
        resp = client.get("/v1/jobs")
        assert resp.status_code == 200
        assert resp.headers["RateLimit-Limit"] == "3"
        assert resp.headers["RateLimit-Policy"] == "3;w=1, 100;w=60"
        seen.append(int(resp.headers["RateLimit-Remaining"]))
    assert seen == [2, 1, 0]
    resp = client.get("/v1/jobs")
    body = assert_problem(resp, 429)
    assert body["type"].endswith("rate-limited") and "3 per 1 second" in body["detail"]
    assert 1 <= int(resp.headers["Retry-After"]) <= 1
    assert resp.headers["RateLimit-Remaining"] == "0"


def test_all_limits_take_one_redis_call_and_the_headers_read_its_answer(tenant_client, monkeypatch):
    """All of a plan's limits are checked in one script call (app.limit_storage), and the
    RateLimit headers come from that call's answer, not from a second read of the windows."""
    client = tenant_client("acme", rate_limit="3/second;100/minute")
    redis_client = client.application.extensions["genqueue.limiter"].storage.get_connection()
    commands: list[str] = []
    original = redis_client.execute_command

    def counted(*args, **kwargs):
        commands.append(str(args[0]))
        return original(*args, **kwargs)

    monkeypatch.setattr(redis_client, "execute_command", counted)
    seen = [client.get("/v1/jobs") for _ in range(3)]
    assert [r.headers["RateLimit-Remaining"] for r in seen] == ["2", "1", "0"]
    assert commands == ["EVALSHA"] * 3
    assert_problem(client.get("/v1/jobs"), 429)


def test_a_refused_request_counts_against_no_limit(tenant_client):
    """The longer window comes first in the plan, and the burst refuses the third request: that
    refusal must not use up the minute's budget (flask-limiter counted it there)."""
    client = tenant_client("acme", rate_limit="4/minute;2/second")
    assert [client.get("/v1/jobs").status_code for _ in range(3)] == [200, 200, 429]
    time.sleep(2.1)  # both of the burst's windows gone (the previous one weighs in for a second)
    assert [client.get("/v1/jobs").status_code for _ in range(3)] == [200, 200, 429]
    resp = client.get("/v1/jobs")
    assert "4 per 1 minute" in assert_problem(resp, 429)["detail"]


def test_sustained_limit_binds_after_the_burst(tenant_client):
    client = tenant_client("acme", rate_limit="50/second;4/minute")
    for _ in range(4):
        assert client.get("/v1/jobs").status_code == 200
    resp = client.get("/v1/jobs")
    assert_problem(resp, 429)
    assert resp.headers["RateLimit-Limit"] == "4"
    assert 50 <= int(resp.headers["Retry-After"]) <= 60


def test_limits_are_per_key_and_submits_count(tenant_client, sessions):
    first = tenant_client("acme", rate_limit="2/minute")
    second = tenant_client("acme")  # same tenant, another key: its own budget
    assert submit(first).status_code == 202 and first.get("/v1/jobs").status_code == 200
    assert_problem(submit(first), 429)
    assert job_count(sessions) == 1  # the refused submit wrote nothing
    assert second.get("/v1/jobs").status_code == 200
    assert tenant_client("other").get("/v1/jobs").status_code == 200


def test_counters_are_shared_by_every_web_process(make_app, tenant_client, sessions):
    key = make_api_key(sessions, "acme", rate_limit="3/minute")
    a, b = make_app(), make_app()  # two apps, as two gunicorn workers would be
    clients = [authed_client_class(key)(app, app.response_class, True) for app in (a, b, a)]
    assert [c.get("/v1/jobs").status_code for c in clients] == [200, 200, 200]
    assert_problem(clients[1].get("/v1/jobs"), 429)


def test_public_endpoints_are_not_limited(tenant_client):
    client = tenant_client("acme", rate_limit="1/minute")
    assert client.get("/v1/jobs").status_code == 200
    for _ in range(3):
        assert client.get("/v1/health").status_code == 200
        assert "RateLimit-Limit" not in client.get("/v1/health").headers


def test_limiter_redis_down_lets_requests_through(make_app, sessions):
    client = make_app(ratelimit_url="redis://127.0.0.1:1/0").test_client()
    for _ in range(3):
        assert submit(client).status_code == 202  # quota counted in Postgres meanwhile
    assert job_count(sessions) == 3


# --- concurrency quota ---------------------------------------------------------------------------


def test_quota_counts_queued_and_running_jobs(tenant_client, sessions):
    client = tenant_client("acme", max_active_jobs=2)
    first = submit(client).get_json()
    second = submit(client).get_json()
    resp = submit(client)
    body = assert_problem(resp, 429)
    assert body["type"].endswith("concurrency-limit") and body["limits"] == {"max_active_jobs": 2}
    assert "2 queued or running" in body["detail"] and int(resp.headers["Retry-After"]) > 0
    assert job_count(sessions) == 2
    assert submit(tenant_client("other")).status_code == 202  # another tenant has its own quota
    with transaction(sessions) as s:  # one starts running: still active
        assert states.start_text(s, uuid.UUID(first["id"]))
    assert_problem(submit(client), 429)
    with transaction(sessions) as s:  # a worker finishes it: a slot frees at once
        states.complete_text(s, uuid.UUID(first["id"]), "t", 0.1, final=True, progress=100)
    assert submit(client).status_code == 202
    assert_problem(submit(client), 429)
    assert client.post(f"/v1/jobs/{second['id']}/cancel").status_code == 200
    assert submit(client).status_code == 202


def test_a_submit_reserves_its_quota_slot_in_one_redis_call(app, client, monkeypatch):
    """Outside the reconciliation (at most every SYNC_S per tenant), the slot takes one script
    call, which also renews the reconciliation marker when it has lapsed (app.quota)."""
    assert submit(client).status_code == 202  # the tenant's first: reconciled, marker set
    store = app.extensions["genqueue.admission"].quota.store.client
    commands: list[str] = []
    original = store.execute_command

    def counted(*args, **kwargs):
        commands.append(str(args[0]))
        return original(*args, **kwargs)

    monkeypatch.setattr(store, "execute_command", counted)
    assert [submit(client).status_code for _ in range(3)] == [202] * 3
    assert commands == ["EVALSHA"] * 3


def test_quota_holds_under_concurrent_submits(app, tenant_client, sessions):
    key = make_api_key(sessions, "acme", max_active_jobs=3)
    statuses: list[int] = []
    barrier = threading.Barrier(10)

    def one() -> None:
        client = authed_client_class(key)(app, app.response_class, True)
        barrier.wait()
        statuses.append(submit(client).status_code)

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(statuses) == [202] * 3 + [429] * 7
    assert job_count(sessions) == 3


def test_quota_survives_losing_its_redis_state(tenant_client, sessions, broker):
    client = tenant_client("acme", max_active_jobs=2)
    submit(client)
    submit(client)
    broker.flushdb()  # reservations and counters gone; the jobs are still active in Postgres
    assert_problem(submit(client), 429)


def test_quota_reconciles_a_large_set_a_chunk_at_a_time(app, tenant_client, sessions, broker, monkeypatch):
    from app import quota

    monkeypatch.setattr(quota, "CHUNK", 3)  # 8 members: three chunks
    client = tenant_client("acme", max_active_jobs=100)
    ids = [uuid.UUID(submit(client).get_json()["id"]) for _ in range(8)]
    with transaction(sessions) as s:  # five finish behind the API's back
        for jid in ids[:5]:
            states.fail(s, jid, "x", "finished elsewhere", None)
    store = app.extensions["genqueue.admission"].quota
    with sessions() as s:
        tenant = s.scalar(select(Job.tenant_id).where(Job.id == ids[0]))
    key = store._key(tenant)
    ghost = str(uuid.uuid4())  # a reservation whose row never came, long ago
    broker.zadd(key, {ghost: 1.0})
    store._sync(tenant, key, full=True)
    assert {m.decode() for m in broker.zrange(key, 0, -1)} == {str(j) for j in ids[5:]}
    broker.delete(key)  # Redis lost the set: the active jobs come back, in chunks
    store._sync(tenant, key)
    assert {m.decode() for m in broker.zrange(key, 0, -1)} == {str(j) for j in ids[5:]}


def test_the_periodic_reconciliation_reads_finished_jobs_not_the_whole_set(
    app, tenant_client, sessions, broker, monkeypatch
):
    # Between full reconciliations (FULL_SYNC_S) the set is not read: the jobs finished since the
    # process last looked are dropped, however large the tenant's backlog.
    from app import quota

    client = tenant_client("acme", max_active_jobs=100)
    ids = [uuid.UUID(submit(client).get_json()["id"]) for _ in range(6)]
    store = app.extensions["genqueue.admission"].quota
    with sessions() as s:
        tenant = s.scalar(select(Job.tenant_id).where(Job.id == ids[0]))
    key = store._key(tenant)
    store._sync(tenant, key, full=True)
    with transaction(sessions) as s:  # two finish behind the API's back
        states.fail(s, ids[0], "x", "finished elsewhere", None)
        states.cancel(s, ids[1])
    ghost = str(uuid.uuid4())
    broker.zadd(key, {ghost: 1.0})  # only a full reconciliation drops a reservation that never came
    monkeypatch.setattr(store.store, "chunks", lambda *a: pytest.fail("the whole set was read"))
    store._sync(tenant, key)
    assert {m.decode() for m in broker.zrange(key, 0, -1)} == {str(j) for j in ids[2:]} | {ghost}
    monkeypatch.undo()
    monkeypatch.setattr(quota, "FULL_SYNC_S", 0.0)  # a full one is due: the ghost goes too
    store._sync(tenant, key)
    assert {m.decode() for m in broker.zrange(key, 0, -1)} == {str(j) for j in ids[2:]}


def test_a_refusal_reconciles_in_full_first(app, tenant_client, sessions, broker):
    client = tenant_client("acme", max_active_jobs=2)
    submit(client)
    store = app.extensions["genqueue.admission"].quota
    with sessions() as s:
        tenant = s.scalar(select(Job.tenant_id))
    broker.zadd(store._key(tenant), {str(uuid.uuid4()): 1.0})  # a stale reservation holds the last slot
    assert submit(client).status_code == 202  # the full reconciliation before refusing dropped it
    assert_problem(submit(client), 429)


def test_quota_slot_is_released_when_the_job_is_not_accepted(make_app, sessions, settings):
    key = make_api_key(sessions, "acme", max_active_jobs=1)
    # The broker is down, the quota store is not: the slot is reserved, then the publish fails.
    dead = make_app(broker_url="redis://127.0.0.1:1/0", ratelimit_url=settings.broker_url)
    dead.test_client_class = authed_client_class(key)
    assert_problem(submit(dead.test_client()), 503)
    assert job_count(sessions) == 0
    live = make_app()
    live.test_client_class = authed_client_class(key)
    assert submit(live.test_client()).status_code == 202


# --- plans ---------------------------------------------------------------------------------------


def test_plan_limits_answer_403_naming_each_limit(tenant_client, sessions):
    client = tenant_client(
        "acme", max_width=512, max_height=512, max_frames=17, max_steps=10, max_priority="normal",
        max_prompt_chars=20,
    )  # fmt: skip
    ok = {"width": 512, "height": 256, "num_frames": 17, "steps": 10}
    assert submit(client, modality="video", params=ok).status_code == 202
    resp = submit(
        client, modality="video", prompt="x" * 21, priority="high",
        params={"width": 1024, "height": 512, "num_frames": 21, "steps": 20},
    )  # fmt: skip
    body = assert_problem(resp, 403)
    assert body["type"].endswith("plan-limit")
    assert body["limits"] == {
        "max_prompt_chars": 20, "max_priority": "normal", "max_width": 512, "max_frames": 17, "max_steps": 10,
    }  # fmt: skip
    fields = {e["field"]: e["message"] for e in body["errors"]}
    assert set(fields) == {"prompt", "priority", "params.width", "params.num_frames", "params.steps"}
    assert "max_width=512" in fields["params.width"] and "1024" in fields["params.width"]
    for name in ("max_width", "max_frames", "max_steps", "max_priority", "max_prompt_chars"):
        assert name in body["detail"]
    assert job_count(sessions) == 1


def test_default_plan_comes_from_configuration(make_app, sessions):
    client = make_app(plan_max_steps=4, plan_max_priority="low").test_client()
    body = assert_problem(submit(client, modality="video", priority="low"), 403)  # default steps (8) > 4
    assert body["limits"] == {"max_steps": 4}
    assert submit(client, modality="video", priority="low", params={"steps": 4}).status_code == 202
    assert assert_problem(submit(client, priority="normal"), 403)["limits"] == {"max_priority": "low"}


def test_schema_bounds_still_come_first(tenant_client):
    client = tenant_client("acme", max_width=512)
    body = assert_problem(submit(client, modality="video", params={"width": 2048}), 422)
    assert body["errors"][0]["field"] == "params.width"


# --- admission control ---------------------------------------------------------------------------


def test_text_backlog_bound_answers_503(make_app, sessions):
    client = make_app(admission_max_text_backlog=3, admission_cache_s=0).test_client()
    add_jobs(sessions, 2)
    assert submit(client).status_code == 202  # the third queued job: at the bound now
    resp = submit(client)
    body = assert_problem(resp, 503)
    assert body["type"].endswith("overloaded") and body["stage"] == "text"
    assert int(resp.headers["Retry-After"]) > 0
    assert job_count(sessions) == 3
    with transaction(sessions) as s:
        s.execute(Job.__table__.update().values(status=JobStatus.RUNNING, stage="text"))
    assert submit(client).status_code == 202  # running jobs no longer wait for the text stage


def test_video_backlog_bound_applies_to_video_jobs_only(make_app, sessions):
    client = make_app(admission_max_video_backlog=2, admission_cache_s=0).test_client()
    add_jobs(sessions, 2, modality="video", status=JobStatus.RUNNING, stage="video")
    assert assert_problem(submit(client, modality="video"), 503)["stage"] == "video"
    assert submit(client, modality="text").status_code == 202


def test_estimated_wait_bound(make_app, sessions):
    client = make_app(admission_max_wait_s=10, admission_cache_s=0).test_client()
    add_jobs(sessions, 20)  # nothing finished yet: no estimate, the backlog bounds alone apply
    assert submit(client).status_code == 202
    recent = utcnow() - timedelta(seconds=30)
    add_jobs(sessions, 60, status=JobStatus.SUCCEEDED, completed_at=recent)  # 1 job/s
    resp = submit(client)  # 21 active at 1/s: about 21 s
    body = assert_problem(resp, 503)
    assert "estimated wait" in body["detail"] and 10 <= int(resp.headers["Retry-After"]) <= 12


def test_backlog_is_measured_once_per_interval(make_app, sessions, monkeypatch):
    flask_app = make_app(admission_cache_s=60)
    client = flask_app.test_client()
    with flask_app.app_context():
        gate = admission()
    calls = []
    original = gate._measure
    monkeypatch.setattr(gate, "_measure", lambda: calls.append(1) or original())
    for _ in range(5):
        assert submit(client).status_code == 202
    assert len(calls) == 1


def test_limiter_runs_cleanly_for_every_kind_of_request(client, anon_client, caplog):
    """The limiter swallows its own errors (fail open): make sure it has none to swallow."""
    import logging

    caplog.set_level(logging.DEBUG)
    for c in (client, anon_client):
        for path in ("/v1/health", "/v1/ready", "/v1/jobs", "/openapi.json", "/v1/nothing"):
            c.get(path)
    assert submit(client).status_code == 202
    bad = [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert not bad, [r.getMessage() for r in bad]
