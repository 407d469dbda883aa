"""Webhooks end to end: real API, Postgres, Redis, a real Celery worker and a real HTTP receiver."""

from __future__ import annotations

import itertools
import threading
import time
import uuid
from datetime import datetime
from urllib.parse import urlsplit

import pytest
from sqlalchemy import func, select, text
from werkzeug import Response

from models import ssrf
from models.webhook import DeliveryStatus, WebhookDelivery, WebhookEndpoint, WebhookMessage
from tasks.webhooks import _lock_args
from tests.support.api import wait_finished
from tests.support.procs import wait_for
from tests.webhooks.helpers import deliveries, secret, submit
from tests.webhooks.test_ssrf import fake_dns


def settled(sessions, job_id: str) -> bool:
    """Nothing more will be sent for this finished job: every webhook message of it fanned out,
    no delivery pending (a retry scheduled counts as pending). Call once the job has finished."""
    jid = uuid.UUID(job_id)
    with sessions() as s:
        unsent = s.scalar(
            select(func.count())
            .select_from(WebhookMessage)
            .where(WebhookMessage.job_id == jid, WebhookMessage.fanned_out_at.is_(None))
        )
        pending = s.scalar(
            select(func.count())
            .select_from(WebhookDelivery)
            .where(WebhookDelivery.job_id == jid, WebhookDelivery.status == DeliveryStatus.PENDING)
        )
    return unsent == 0 and pending == 0


def wait_settled(sessions, job_id: str) -> None:
    wait_for(lambda: settled(sessions, job_id), 30, 0.05, f"job {job_id}'s webhooks to settle")


def test_terminal_event_is_signed_and_carries_the_job_resource(hook_client, hook_worker, receiver, sessions):
    job_id = submit(hook_client, receiver)
    job = wait_finished(hook_client, job_id)
    receiver.wait_for(lambda r: len(r.calls) == 1)
    call = receiver.calls[0]
    payload = receiver.verify(secret(hook_client), call)  # the standardwebhooks package verifies it
    assert payload["type"] == "job.succeeded"
    assert payload["id"] == call.headers["Webhook-Id"] and payload["id"].startswith("msg_")
    assert payload["data"] == job  # exactly what GET /v1/jobs/{id} returns
    assert payload["timestamp"].endswith("Z")
    assert call.headers["Content-Type"] == "application/json"
    wait_settled(sessions, job_id)
    assert len(receiver.calls) == 1, "default events are the terminal ones: no started/text events"
    [d] = deliveries(hook_client, job_id)
    assert (d["status"], d["attempts"], d["webhook_id"]) == ("delivered", 1, payload["id"])
    assert d["attempt_log"][0]["status_code"] == 200 and d["attempt_log"][0]["duration_ms"] >= 0


def test_wrong_secret_fails_verification(hook_client, hook_worker, receiver):
    from standardwebhooks import Webhook
    from standardwebhooks.webhooks import WebhookVerificationError

    submit(hook_client, receiver)
    receiver.wait_for(lambda r: len(r.calls) == 1)
    with pytest.raises(WebhookVerificationError):
        Webhook("whsec_" + "A" * 43 + "=").verify(receiver.calls[0].body, receiver.calls[0].headers)


@pytest.mark.parametrize("overrides", [{"webhook_progress_interval_s": 0.3}])
def test_every_event_in_order_with_throttled_progress(hook_client, hook_worker, receiver, monkeypatch):
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.1")
    job_id = submit(
        hook_client,
        receiver,
        events=["job.started", "job.text.completed", "job.progress", "job.succeeded"],
        modality="video",
        params={"width": 64, "height": 64, "num_frames": 5, "steps": 12},
    )
    wait_finished(hook_client, job_id)
    receiver.wait_for(lambda r: any(c.payload["type"] == "job.succeeded" for c in r.calls))
    key = secret(hook_client)
    payloads = [receiver.verify(key, c) for c in receiver.calls]
    types = [p["type"] for p in payloads]
    assert types[:2] == ["job.started", "job.text.completed"] and types[-1] == "job.succeeded"
    progress = [p for p in payloads if p["type"] == "job.progress"]
    assert progress, types  # 12 steps x 0.1 s (or more on a busy machine)
    stamps = [datetime.fromisoformat(p["timestamp"]) for p in progress]
    gaps = [(b - a).total_seconds() for a, b in itertools.pairwise(stamps)]
    assert all(g >= 0.3 for g in gaps), gaps  # at most one job.progress per interval
    values = [p["data"]["progress"] for p in progress]
    assert values == sorted(values) and all(20 < v < 100 for v in values)
    # Snapshots: each event carries the job as that event left it, not as it is now.
    assert payloads[0]["data"]["status"] == "running" and payloads[0]["data"]["outputs"]["text"] is None
    assert payloads[1]["data"]["stage"] == "video" and payloads[1]["data"]["outputs"]["text"]
    assert payloads[-1]["data"]["status"] == "succeeded"
    assert len({p["id"] for p in payloads}) == len(payloads), "one webhook-id per event"


def test_receiver_down_then_up_gets_every_event_in_order(hook_client, hook_worker, receiver):
    receiver.reply = lambda n, p: Response(status=503 if n <= 3 else 200)
    job_id = submit(hook_client, receiver, events=["job.started", "job.text.completed", "job.succeeded"])
    receiver.wait_for(lambda r: len(r.delivered()) == 3)
    seen = [(c.payload["type"], c.status, c.headers["Webhook-Id"]) for c in receiver.calls]
    # The first event is retried until it gets through; the later ones wait behind it.
    assert [s[:2] for s in seen] == [
        ("job.started", 503),
        ("job.started", 503),
        ("job.started", 503),
        ("job.started", 200),
        ("job.text.completed", 200),
        ("job.succeeded", 200),
    ]
    assert len({s[2] for s in seen[:4]}) == 1, "webhook-id is stable across retries"
    key = secret(hook_client)
    for c in receiver.calls:
        receiver.verify(key, c)
    log = {d["event_type"]: d for d in deliveries(hook_client, job_id)}
    started = log["job.started"]
    assert started["status"] == "delivered" and started["attempts"] == 4
    codes = [a["status_code"] for a in started["attempt_log"]]
    assert codes == [503, 503, 503, 200]
    assert all(a["next_attempt_at"] for a in started["attempt_log"][:3])
    assert started["attempt_log"][3]["next_attempt_at"] is None


def test_retry_after_is_honoured(hook_client, hook_worker, receiver):
    receiver.reply = lambda n, p: Response(status=429, headers={"Retry-After": "1"}) if n == 1 else Response()
    submit(hook_client, receiver)
    receiver.wait_for(lambda r: len(r.delivered()) == 1)
    first, second = receiver.calls
    assert second.at - first.at >= 0.95, "the 0.1 s schedule step was stretched to Retry-After"


@pytest.mark.parametrize("overrides", [{"webhook_retry_schedule_s": [0.05, 0.05]}])
def test_exhausted_delivery_fails_and_replays_with_the_same_id(hook_client, hook_worker, receiver, sessions):
    receiver.reply = lambda n, p: Response("down", status=500)
    job_id = submit(hook_client, receiver)
    receiver.wait_for(lambda r: len(r.calls) == 3)
    wait_finished(hook_client, job_id)
    wait_settled(sessions, job_id)
    d = deliveries(hook_client, job_id)[0]
    assert (d["status"], d["attempts"]) == ("failed", 3)
    assert d["attempt_log"][0]["response_excerpt"] == "down"
    receiver.reply = lambda n, p: Response(status=204)
    resp = hook_client.post(f"/v1/webhook-deliveries/{d['id']}/redeliver")
    # "pending" as queued; the worker may already have delivered it before the response was read
    assert resp.status_code == 202 and resp.get_json()["status"] in ("pending", "delivered")
    receiver.wait_for(lambda r: len(r.delivered()) == 1)
    assert receiver.calls[-1].headers["Webhook-Id"] == d["webhook_id"]
    receiver.verify(secret(hook_client), receiver.calls[-1])
    wait_settled(sessions, job_id)  # the delivery is recorded after the receiver answered
    replayed = deliveries(hook_client, job_id)[0]
    assert (replayed["status"], replayed["attempts"]) == ("delivered", 4)


def test_410_disables_the_endpoint(hook_client, hook_worker, receiver, sessions):
    receiver.reply = lambda n, p: Response(status=410)
    job_id = submit(hook_client, receiver, events=["job.started", "job.text.completed", "job.succeeded"])
    wait_finished(hook_client, job_id)
    receiver.wait_for(lambda r: len(r.calls) == 1)
    wait_settled(sessions, job_id)
    assert len(receiver.calls) == 1, "nothing more goes to an endpoint that answered 410"
    log = deliveries(hook_client, job_id)
    # Later events either queued behind it (now disabled) or were never queued (fanned out after).
    assert log[0]["event_type"] == "job.started" and log[0]["status"] == "failed"
    assert log[0]["last_status_code"] == 410 and "disabled" in log[0]["last_error"]
    assert all(d["status"] == "disabled" for d in log[1:])
    with sessions() as s:
        ep = s.scalars(select(WebhookEndpoint).where(WebhookEndpoint.job_id == uuid.UUID(job_id))).one()
        assert ep.disabled_at is not None and ep.disabled_reason == "gone"
    resp = hook_client.post(f"/v1/webhook-deliveries/{log[0]['id']}/redeliver")
    assert resp.status_code == 409 and resp.mimetype == "application/problem+json"


def test_410_stops_what_other_jobs_have_not_sent_yet(
    hook_client, hook_worker, receiver, sessions, monkeypatch
):
    # Three jobs' events to one registered endpoint. Every dispatcher has read its delivery and
    # is resolving the host when the first send gets 410; the other two finish their lookups
    # only once that 410 has disabled the endpoint. Nothing of theirs may reach the receiver.
    jobs = 3
    guard = threading.Lock()
    lookups: list[float] = []  # the dispatchers' lookups (registration's comes before)
    answered: list[float] = []
    all_resolving = threading.Event()
    endpoint: list[uuid.UUID] = []

    def disabled() -> bool:
        with sessions() as s:
            found = s.scalar(select(WebhookEndpoint.disabled_at).where(WebhookEndpoint.id == endpoint[0]))
        return found is not None

    def answer() -> str:
        if not endpoint:
            return "127.0.0.1"  # registration's check
        with guard:
            lookups.append(time.monotonic())
            first = len(lookups) == 1
            if len(lookups) == jobs:
                all_resolving.set()
        if first:
            all_resolving.wait(20)  # every other dispatcher now holds a delivery it read as pending
        else:
            wait_for(disabled, timeout=20, interval=0.01, what="the 410 to disable the endpoint")
        answered.append(time.monotonic())
        return "127.0.0.1"

    monkeypatch.setattr(ssrf, "RESOLVE_TIMEOUT_S", 30.0)
    fake_dns(monkeypatch, {"slow.example": answer})
    receiver.reply = lambda n, p: Response(status=410)
    url = f"http://slow.example:{urlsplit(receiver.url).port}/hook"
    resp = hook_client.post("/v1/webhooks", json={"url": url, "events": ["job.succeeded"]})
    assert resp.status_code == 201, resp.get_json()
    endpoint.append(uuid.UUID(resp.get_json()["id"]))
    job_ids = [uuid.UUID(submit(hook_client)) for _ in range(jobs)]

    def dispatcher_done(job_id: uuid.UUID) -> bool:
        # A job's dispatcher holds its advisory lock from reading the delivery to recording
        # the outcome: once we can take it, whatever that run was going to send has gone out.
        key = _lock_args(job_id)
        with sessions() as s:
            free = bool(s.scalar(text("SELECT pg_try_advisory_lock(:ns, :k)"), key))
            if free:
                s.execute(text("SELECT pg_advisory_unlock(:ns, :k)"), key)
        return free

    wait_for(lambda: len(answered) == jobs, timeout=60, interval=0.02, what="every dispatcher's lookup")
    assert all_resolving.is_set() and len(lookups) == jobs, "all three were in flight together"
    wait_for(lambda: all(dispatcher_done(j) for j in job_ids), timeout=30, interval=0.02, what="dispatchers")
    with sessions() as s:
        rows = s.scalars(select(WebhookDelivery).where(WebhookDelivery.endpoint_id == endpoint[0])).all()
    assert len(receiver.calls) == 1, f"sent after the endpoint was disabled: {receiver.summary()}"
    assert sorted((d.status, d.attempts, d.last_status_code) for d in rows) == [
        ("disabled", 0, None),
        ("disabled", 0, None),
        ("failed", 1, 410),
    ]


def test_redirects_are_not_followed(hook_client, hook_worker, receiver, httpserver, sessions):
    elsewhere = httpserver.url_for("/elsewhere")
    receiver.reply = lambda n, p: Response(status=307, headers={"Location": elsewhere})
    job_id = submit(hook_client, receiver)
    receiver.wait_for(lambda r: len(r.calls) == 1)
    wait_finished(hook_client, job_id)
    wait_settled(sessions, job_id)
    [d] = deliveries(hook_client, job_id)
    assert (d["status"], d["last_status_code"], len(receiver.calls)) == ("failed", 307, 1)
    assert all(req.path != "/elsewhere" for req, _ in httpserver.log)


def test_registered_endpoint_gets_every_event_until_deleted(hook_client, hook_worker, receiver, sessions):
    resp = hook_client.post("/v1/webhooks", json={"url": receiver.url, "description": "all jobs"})
    assert resp.status_code == 201, resp.get_json()
    endpoint = resp.get_json()
    assert endpoint["events"][0] == "job.started" and "job.progress" in endpoint["events"]
    assert [e["id"] for e in hook_client.get("/v1/webhooks").get_json()["data"]] == [endpoint["id"]]
    job_id = submit(hook_client)  # no webhook of its own
    receiver.wait_for(lambda r: [c.payload["type"] for c in r.calls][-1:] == ["job.succeeded"])
    types = [c.payload["type"] for c in receiver.calls]
    # job.progress is sent when progress moves by enough within the throttle interval, which a
    # slow machine's text stage can reach; any it sent comes between the start and the end.
    assert [t for t in types if t != "job.progress"] == ["job.started", "job.text.completed", "job.succeeded"]
    assert "job.progress" not in (types[0], types[-1])
    assert {c.payload["data"]["id"] for c in receiver.calls} == {job_id}
    assert hook_client.delete(f"/v1/webhooks/{endpoint['id']}").status_code == 204
    assert hook_client.get("/v1/webhooks").get_json()["data"] == []
    assert hook_client.delete(f"/v1/webhooks/{endpoint['id']}").status_code == 404
    second = submit(hook_client)
    wait_finished(hook_client, second)
    wait_settled(sessions, second)  # its events were fanned out: to no endpoint
    assert len(receiver.calls) == 3
    with sessions() as s:
        assert s.scalars(select(WebhookDelivery)).all().__len__() == 3


def test_secret_rotation_signs_with_both_secrets(hook_client, hook_worker, receiver):
    old = secret(hook_client)
    assert old.startswith("whsec_") and secret(hook_client) == old
    resp = hook_client.post("/v1/webhooks/secret/rotate")
    assert resp.status_code == 200 and resp.headers["Cache-Control"] == "no-store"
    body = resp.get_json()
    new = body["secret"]
    assert new != old and body["previous_secret_active"] and body["previous_expires_at"]
    assert secret(hook_client) == new
    submit(hook_client, receiver)
    receiver.wait_for(lambda r: len(r.calls) == 1)
    call = receiver.calls[0]
    assert len(call.headers["Webhook-Signature"].split(" ")) == 2
    receiver.verify(new, call)
    receiver.verify(old, call)  # receivers still on the old secret keep working during the grace period


@pytest.mark.parametrize("overrides", [{"webhook_secret_grace_s": 0}])
def test_rotation_without_grace_drops_the_old_secret(hook_client, hook_worker, receiver):
    from standardwebhooks.webhooks import WebhookVerificationError

    old = secret(hook_client)
    new = hook_client.post("/v1/webhooks/secret/rotate").get_json()["secret"]
    submit(hook_client, receiver)
    receiver.wait_for(lambda r: len(r.calls) == 1)
    receiver.verify(new, receiver.calls[0])
    with pytest.raises(WebhookVerificationError):
        receiver.verify(old, receiver.calls[0])


def test_cancel_from_the_api_is_delivered(hook_client, hook_worker, receiver, monkeypatch):
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.2")
    params = {"width": 64, "height": 64, "num_frames": 5, "steps": 50}
    job_id = submit(hook_client, receiver, modality="video", params=params)
    wait_for(lambda: hook_client.get(f"/v1/jobs/{job_id}").get_json()["status"] != "queued", 20, 0.05)
    assert hook_client.post(f"/v1/jobs/{job_id}/cancel").status_code == 200
    receiver.wait_for(lambda r: len(r.calls) == 1)
    payload = receiver.verify(secret(hook_client), receiver.calls[0])
    assert payload["type"] == "job.canceled" and payload["data"]["status"] == "canceled"


def test_deliveries_of_unknown_things_are_404(hook_client):
    assert hook_client.get(f"/v1/jobs/{uuid.uuid4()}/webhook-deliveries").status_code == 404
    assert hook_client.post(f"/v1/webhook-deliveries/{uuid.uuid4()}/redeliver").status_code == 404
    assert hook_client.post("/v1/webhook-deliveries/nope/redeliver").status_code == 404


def test_cached_hits_and_followers_send_their_webhooks(hook_client, hook_worker, receiver, monkeypatch):
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.3")  # the leader's video stage takes ~1 s
    body = {"prompt": "a fox", "modality": "video", "webhook": {"url": receiver.url},
            "params": {"seed": 3, "width": 64, "height": 64, "num_frames": 1, "steps": 3}}  # fmt: skip
    leader = hook_client.post("/v1/jobs", json=body).get_json()
    follower = hook_client.post("/v1/jobs", json=body).get_json()
    assert (follower["status"], follower["cached"]) == ("queued", True)  # attached to the leader
    assert wait_finished(hook_client, leader["id"])["status"] == "succeeded"
    hit = hook_client.post("/v1/jobs", json=body)
    assert hit.status_code == 200 and hit.get_json()["cached"] is True  # answered from the cache
    ids = {leader["id"], follower["id"], hit.get_json()["id"]}
    receiver.wait_for(lambda r: len(r.calls) == 3)
    payloads = [receiver.verify(secret(hook_client), call) for call in receiver.calls]
    assert {p["data"]["id"] for p in payloads} == ids
    assert {p["type"] for p in payloads} == {"job.succeeded"}
    for p in payloads:
        assert p["data"]["cached"] is (p["data"]["id"] != leader["id"])
        assert p["data"] == hook_client.get(f"/v1/jobs/{p['data']['id']}").get_json()
