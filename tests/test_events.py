"""GET /v1/jobs/{id}/events, real workers: replay then live, resume, pages, isolation, limits, progress."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.support.api import assert_problem
from tests.support.jobs import wait_until
from tests.support.workers import thread_workers

GEN = "tests.support.generators"
SSE = {"Accept": "text/event-stream"}


@dataclass
class Frame:
    event: str  # "" for a comment line (heartbeat)
    data: dict[str, Any]
    id: int | None


def frames(resp: Any) -> Iterator[Frame]:
    """The stream's frames as they arrive (retry: lines skipped)."""
    buf = b""
    for chunk in resp.response:
        buf += chunk
        while b"\n\n" in buf:
            block, buf = buf.split(b"\n\n", 1)
            fields: dict[str, str] = {}
            for line in block.decode().split("\n"):
                if line.startswith(":"):
                    fields.setdefault("comment", line)
                    continue
                key, _, value = line.partition(": ")
                fields[key] = value
            if "event" in fields:
                yield Frame(
                    fields["event"], json.loads(fields["data"]), int(fields["id"]) if "id" in fields else None
                )
            elif "comment" in fields:
                yield Frame("", {}, None)


def stream(client: Any, jid: uuid.UUID, **headers: str) -> Any:
    resp = client.get(f"/v1/jobs/{jid}/events", headers=SSE | headers, buffered=False)
    assert resp.status_code == 200, resp.get_data()
    assert resp.mimetype == "text/event-stream"
    return resp


def submit(client: Any, **body: Any) -> uuid.UUID:
    payload = {"prompt": "a fox in the snow at dusk", "modality": "video"} | body
    resp = client.post("/v1/jobs", json=payload)
    assert resp.status_code == 202, resp.get_json()
    return uuid.UUID(resp.get_json()["id"])


def stored(sessions: Any, jid: uuid.UUID) -> list[tuple[int, str]]:
    from sqlalchemy import select

    from models.job import JobEvent

    with sessions() as s:
        return [
            (e.id, e.type)
            for e in s.scalars(select(JobEvent).where(JobEvent.job_id == jid).order_by(JobEvent.id))
        ]


def until_end(resp: Any, timeout: float = 60) -> list[Frame]:
    out: list[Frame] = []
    deadline = time.monotonic() + timeout
    for f in frames(resp):
        out.append(f)
        assert time.monotonic() < deadline, "the stream did not end"
    return out


@pytest.fixture
def quiet_app(make_app):
    """Only a notification can wake a stream (no polling, no heartbeat within a test's time)."""
    return make_app(stream_poll_s=30, stream_heartbeat_s=30)


VIDEO = {"width": 64, "height": 64, "num_frames": 5, "steps": 40}


def test_the_stream_replays_then_goes_live_and_ends_after_the_terminal_event(
    quiet_app, settings, sessions, monkeypatch
):
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.05")  # 2 s of video steps
    client = quiet_app.test_client()
    with thread_workers(settings, progress_interval_s=0.25):
        jid = submit(client, params=VIDEO)
        wait_until(sessions, jid, lambda j: j.stage == "video" and j.status == "running", what="video stage")
        replayed = [i for i, _ in stored(sessions, jid)]
        got = until_end(stream(client, jid))
    kinds = [f.event for f in got]
    assert kinds[-1] == "job.succeeded"
    ids = [f.id for f in got if f.id is not None]
    assert ids == [i for i, _ in stored(sessions, jid)]  # every stored event once, in order
    assert ids[: len(replayed)] == replayed and len(ids) > len(replayed)  # replay, then live
    assert kinds[:2] == ["job.started", "job.text.completed"]
    live = [f.data["data"]["progress"] for f in got if f.event == "job.progress"]
    assert len(live) >= 3, live  # moved during the 40 steps, not only at their end
    assert live == sorted(live) and len(set(live)) == len(live)
    assert all(20 <= p <= 95 for p in live)


def test_last_event_id_resumes_without_gaps_or_duplicates(quiet_app, settings, sessions, monkeypatch):
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.05")
    client = quiet_app.test_client()
    with thread_workers(settings, progress_interval_s=0.1, webhook_progress_interval_s=0.3):
        jid = submit(client, params=VIDEO)
        first = stream(client, jid)
        seen: list[int] = []
        for f in frames(first):
            if f.id is not None:
                seen.append(f.id)
            if len(seen) == 3:
                break
        first.close()  # the client drops mid-job
        rest = until_end(stream(client, jid, **{"Last-Event-ID": str(seen[-1])}))
    again = [f.id for f in rest if f.id is not None]
    everything = [i for i, _ in stored(sessions, jid)]
    assert seen + again == everything[: len(seen) + len(again)]
    assert rest[-1].event == "job.succeeded" and len(set(seen + again)) == len(seen + again)
    # ?after= is the same cursor
    tail = until_end(client.get(f"/v1/jobs/{jid}/events?after={seen[0]}", headers=SSE, buffered=False))
    assert [f.id for f in tail if f.id is not None] == [i for i in everything if i > seen[0]]


def test_the_json_page_walks_the_stored_events(client, worker, sessions):
    jid = submit(client, params={"width": 64, "height": 64, "num_frames": 5, "steps": 2})
    wait_until(sessions, jid, lambda j: j.status == "succeeded", what="the job to finish")
    everything = stored(sessions, jid)
    walked: list[tuple[int, str]] = []
    after = 0
    while True:
        body = client.get(f"/v1/jobs/{jid}/events?after={after}&limit=1").get_json()
        walked += [(e["id"], e["type"]) for e in body["data"]]
        after = body["next_after"]
        if not body["has_more"]:
            break
    assert walked == everything and everything[-1][1] == "job.succeeded"
    assert body["data"][0]["to_status"] == "succeeded"
    assert_problem(client.get(f"/v1/jobs/{jid}/events?limit=0"), 422)
    assert_problem(client.get(f"/v1/jobs/{jid}/events", headers={"Last-Event-ID": "x"}), 422)


def test_another_tenants_job_is_not_found(client, tenant_client):
    jid = submit(client)
    other = tenant_client("other")
    assert_problem(other.get(f"/v1/jobs/{jid}/events"), 404)
    assert_problem(other.get(f"/v1/jobs/{jid}/events", headers=SSE), 404)
    assert_problem(client.get(f"/v1/jobs/{uuid.uuid4()}/events", headers=SSE), 404)


def test_heartbeats_keep_an_idle_stream_open_until_it_ends(make_app):
    client = make_app(stream_heartbeat_s=0.2).test_client()
    jid = submit(client)  # no worker: it stays queued
    resp = stream(client, jid)
    got: list[Frame] = []
    started = time.monotonic()
    for f in frames(resp):
        got.append(f)
        if sum(1 for g in got if g.event == "") >= 3:
            break
    assert time.monotonic() - started >= 0.4  # spaced by the setting, not sent in a burst
    assert [f.event for f in got if f.event] == ["job.progress"]  # the job's progress (0), nothing else
    assert client.post(f"/v1/jobs/{jid}/cancel").status_code == 200
    assert [f.event for f in until_end(resp, 10) if f.event][-1] == "job.canceled"


def test_streams_past_the_tenant_or_process_bound_are_refused(make_app, tenant_client, sessions):
    from tests.support.api import authed_client_class, make_api_key

    app = make_app(stream_max_per_tenant=1, stream_max_per_process=2)
    client = app.test_client()
    jid = submit(client)
    held = stream(client, jid)
    problem = assert_problem(client.get(f"/v1/jobs/{jid}/events", headers=SSE), 429)
    assert problem["type"].endswith(":rate-limited")
    other = authed_client_class(make_api_key(sessions, "other"))(app, app.response_class, True)
    third = authed_client_class(make_api_key(sessions, "third"))(app, app.response_class, True)
    jb, jc = submit(other), submit(third)
    held_b = stream(other, jb)
    assert_problem(third.get(f"/v1/jobs/{jc}/events", headers=SSE), 503)
    held.close()  # a slot frees when its client goes
    stream(third, jc).close()
    held_b.close()
    assert app.extensions["genqueue.event_hub"].streams == 0


def test_idle_streams_hold_no_database_connection(make_app, settings, sessions):
    """Twice as many streams as pooled connections (and no overflow), yet polls are served."""
    app = make_app(db_pool_size=2, db_max_overflow=0, stream_heartbeat_s=30, stream_poll_s=30)
    client = app.test_client()
    jid = submit(client)
    started, ended = threading.Barrier(5), []

    def consume() -> None:
        resp = stream(app.test_client(), jid)
        it = frames(resp)
        next(it)  # the job's progress: the stream has read and now sleeps
        started.wait(10)
        ended.append([f.event for f in it])

    threads = [threading.Thread(target=consume) for _ in range(4)]
    for t in threads:
        t.start()
    started.wait(10)
    for _ in range(5):
        resp = client.get(f"/v1/jobs/{jid}")
        assert resp.status_code == 200 and resp.get_json()["status"] == "queued"
    assert client.post(f"/v1/jobs/{jid}/cancel").status_code == 200
    for t in threads:
        t.join(10)
    assert ended == [["job.canceled"]] * 4


def test_text_progress_moves_per_token_and_is_throttled(quiet_app, settings, sessions, monkeypatch):
    monkeypatch.setenv("GENQUEUE_TEST_TOKEN_SECONDS", "0.05")
    client = quiet_app.test_client()
    words = " ".join(f"w{i}" for i in range(40))  # 40 tokens: 2 s
    with thread_workers(settings, text_model=f"{GEN}:SlowText", progress_interval_s=0.25):
        jid = submit(client, prompt=words, modality="text", params={"max_new_tokens": 40})
        resp = stream(client, jid)
        started = time.monotonic()
        got = until_end(resp)
        took = time.monotonic() - started
    live = [f.data["data"]["progress"] for f in got if f.event == "job.progress"]
    assert got[-1].event == "job.succeeded"
    assert live == sorted(live) and len(set(live)) == len(live)
    moving = [p for p in live if 0 < p < 99]
    assert len(moving) >= 3, live  # per token, not 0 then 100
    assert len(moving) <= took / 0.25 + 2  # at most one write per throttle window
    resource = client.get(f"/v1/jobs/{jid}").get_json()
    assert resource["progress"] == 100


def test_a_storyboard_streams_each_shot_as_it_completes(quiet_app, settings, sessions, monkeypatch):
    """Opened as the job starts: every job.shot.completed comes through, in order, then the end."""
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.1")
    client = quiet_app.test_client()
    params = VIDEO | {"steps": 10, "shots": 3, "enhance_prompt": False, "fps": 6}
    prompt = "A boat leaves. A storm comes. The boat returns."
    with thread_workers(settings):
        jid = submit(client, prompt=prompt, modality="storyboard", params=params)
        got = until_end(stream(client, jid), timeout=90)
    events = [f for f in got if f.event]
    shots = [f for f in events if f.event == "job.shot.completed"]
    assert sorted(f.data["data"]["shot"] for f in shots) == [0, 1, 2], [f.event for f in events]
    assert [f.data["data"]["shots_completed"] for f in shots] == [1, 2, 3]
    assert events[-1].event == "job.succeeded"
    # Every stored event, in order (live progress frames carry no id: they are not stored).
    assert [f.id for f in events if f.id is not None] == [i for i, _ in stored(sessions, jid)]


def test_a_job_with_variants_streams_each_one_then_ends(quiet_app, settings, sessions):
    """The stream stays open past job.succeeded while variants are made: one job.variant.completed
    each (what is left counting down), then it ends."""
    client = quiet_app.test_client()
    params = VIDEO | {"steps": 2, "variants": ["webm", "preview"]}
    with thread_workers(settings):
        jid = submit(client, params=params)
        got = until_end(stream(client, jid), timeout=90)
    events = [f for f in got if f.event and f.id is not None]
    names = [f.event for f in events]
    assert names.index("job.succeeded") < names.index("job.variant.completed"), names
    made = [f.data["data"] for f in events if f.event == "job.variant.completed"]
    assert [(d["variant"], d["status"], d["variants_pending"]) for d in made] == [
        ("webm", "ready", 1),
        ("preview", "ready", 0),
    ]
    assert all(d["bytes"] > 0 for d in made) and events[-1].event == "job.variant.completed"
    assert [f.id for f in events] == [i for i, _ in stored(sessions, jid)]
    # A stream opened afterwards replays them and ends too.
    again = [f.event for f in until_end(stream(client, jid), timeout=10) if f.id is not None]
    assert again == names
