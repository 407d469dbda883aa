"""GET /v1/usage and `genqueue usage`: real jobs through a real worker, numbers checked against the rows.

Two tenants; tenant A runs a video job with a coalesced follower and later a cache hit of it, a
job that fails, and a text job whose stage fails transiently twice before it succeeds. Every
text call of the test adapter costs GENQUEUE_TEST_CALL_SECONDS per request, so each attempt's
GPU share has a known floor.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from click.testing import CliRunner
from sqlalchemy import select, update

from app.cli import main
from models import Job
from models.db import transaction
from models.tenant import DEFAULT_TENANT_ID, DEFAULT_TENANT_NAME
from models.usage import Usage
from tasks.batching import Meter, MicroBatcher
from tasks.contract.publish import publish_job
from tests.support.api import wait_finished
from tests.support.jobs import broker_idle, events, wait_until
from tests.support.procs import wait_for
from tests.support.workers import thread_workers

TEXT_MODEL = "tests.support.generators:CostlyFlakyText"
CALL_S = 0.1  # GPU seconds each text request costs per call (CostlyFlakyText)
VIDEO = {"seed": 5, "width": 64, "height": 64, "num_frames": 5, "steps": 2}


def _iso(value: datetime) -> str:
    return value.isoformat().replace("+00:00", "Z")


def _rows(sessions: Any, tenant_id: uuid.UUID) -> dict[uuid.UUID, Job]:
    with sessions() as s:
        return {j.id: j for j in s.scalars(select(Job).where(Job.tenant_id == tenant_id))}


def _gpu(rows: Any, column: str) -> float:
    return sum(getattr(j, column) or 0.0 for j in rows)


@pytest.fixture
def scenario(client, tenant_client, settings, sessions, broker, monkeypatch) -> dict[str, Any]:
    """Run the jobs; returns their ids, tenant B's client and a window around them."""
    monkeypatch.setenv("GENQUEUE_TEST_CALL_SECONDS", str(CALL_S))
    beta = tenant_client("beta")
    start = datetime.now(UTC) - timedelta(hours=1)
    leader = client.post("/v1/jobs", json={"prompt": "a paper boat", "modality": "video", "params": VIDEO})
    follower = client.post("/v1/jobs", json={"prompt": "a paper boat", "modality": "video", "params": VIDEO})
    assert follower.get_json()["cached"] is True and follower.get_json()["status"] == "queued"
    other = beta.post("/v1/jobs", json={"prompt": "beta words here", "modality": "text"})
    flaky_prompt = f"a heron [[flaky:2]] {uuid.uuid4().hex}"
    with thread_workers(settings, text_model=TEXT_MODEL) as worker_app:
        flaky = client.post("/v1/jobs", json={"prompt": flaky_prompt, "modality": "text"})
        ids = {
            "leader": leader.get_json()["id"],
            "follower": follower.get_json()["id"],
            "flaky": flaky.get_json()["id"],
        }
        done = {name: wait_finished(client, jid, timeout=60) for name, jid in ids.items()}
        assert wait_finished(beta, other.get_json()["id"], timeout=60)["status"] == "succeeded"
        # Alone: a refused request sharing a call would take a share of its time (the meter
        # charges a call evenly), and the floors below assume every request in a call ran.
        failed = client.post("/v1/jobs", json={"prompt": "please [[fail]]", "modality": "text"})
        ids["failed"] = failed.get_json()["id"]
        done["failed"] = wait_finished(client, ids["failed"], timeout=60)
        assert [done[n]["status"] for n in ids] == ["succeeded", "succeeded", "succeeded", "failed"]
        hit = client.post("/v1/jobs", json={"prompt": "a paper boat", "modality": "video", "params": VIDEO})
        assert (hit.status_code, hit.get_json()["cached"]) == (200, True)
        ids["hit"] = hit.get_json()["id"]
        before = _rows(sessions, DEFAULT_TENANT_ID)[uuid.UUID(ids["leader"])]
        # A duplicated message of the whole chain finds both stages done: it must cost nothing.
        publish_job(worker_app, ids["leader"], "video", "normal")
        wait_for(lambda: broker_idle(broker), 30, what="the duplicate to be consumed")
    after = _rows(sessions, DEFAULT_TENANT_ID)[uuid.UUID(ids["leader"])]
    assert (after.text_gpu_s, after.video_gpu_s) == (before.text_gpu_s, before.video_gpu_s)
    end = datetime.now(UTC) + timedelta(minutes=1)
    return {"ids": ids, "beta": beta, "window": {"from": _iso(start), "to": _iso(end)}, "flaky": flaky_prompt}


def _usage(client: Any, **query: str) -> dict[str, Any]:
    resp = client.get("/v1/usage", query_string=query)
    assert resp.status_code == 200, resp.get_json()
    body = resp.get_json()
    Usage.model_validate(body)  # as documented in /openapi.json
    return body


def _jobs(total: int, succeeded: int = 0, failed: int = 0, canceled: int = 0) -> dict[str, int]:
    return {"total": total, "queued": 0, "running": 0, "succeeded": succeeded, "failed": failed,
            "canceled": canceled}  # fmt: skip


def test_usage_counts_what_ran_once_per_attempt(client, sessions, scenario) -> None:
    ids = {k: uuid.UUID(v) for k, v in scenario["ids"].items()}
    rows = _rows(sessions, DEFAULT_TENANT_ID)
    leader, flaky, failed = rows[ids["leader"]], rows[ids["flaky"]], rows[ids["failed"]]
    # What the worker recorded: cached copies and followers ran nothing.
    for name in ("follower", "hit"):
        job = rows[ids[name]]
        assert job.cached and (job.text_gpu_s, job.video_gpu_s, job.tokens_generated) == (None, None, None)
        assert (job.text_model, job.video_model, job.frames_rendered) == (None, None, None)
    assert (leader.text_model, leader.video_model, leader.frames_rendered) == (TEXT_MODEL, "echo", 5)
    assert leader.tokens_generated == 4  # "Shot: a paper boat"
    assert leader.text_gpu_s >= CALL_S and leader.video_gpu_s > 0
    # It rode in three generate() calls (two failed): each charged, at least three calls' worth,
    # within its run. A call it shared that failed for the batch is rerun alone in the same
    # attempt, so it was retried once or twice.
    assert 1 <= events(sessions, ids["flaky"]).count("job.retrying") <= 2
    assert 3 * CALL_S <= flaky.text_gpu_s <= (flaky.completed_at - flaky.started_at).total_seconds()
    assert flaky.tokens_generated == len(f"Shot: {scenario['flaky']}".split())
    assert failed.text_model == TEXT_MODEL and failed.tokens_generated is None  # refused: no output

    body = _usage(client, **scenario["window"])
    assert (body["object"], body["group_by"], body["groups"]) == ("usage", None, [])
    assert body["from"] == scenario["window"]["from"]
    total = body["total"]
    assert total["jobs"] == _jobs(5, succeeded=4, failed=1)
    assert (total["cache_hits"], total["frames"]) == (2, 5)
    assert total["tokens"] == leader.tokens_generated + flaky.tokens_generated
    text_s, video_s = _gpu(rows.values(), "text_gpu_s"), _gpu(rows.values(), "video_gpu_s")
    assert total["gpu_s"]["text"] == pytest.approx(text_s, abs=1e-5)
    assert total["gpu_s"]["video"] == pytest.approx(leader.video_gpu_s, abs=1e-5) == pytest.approx(video_s)
    assert total["gpu_s"]["total"] == pytest.approx(text_s + video_s, abs=1e-5)
    # The job resource's gpu_s is the same definition.
    job = client.get(f"/v1/jobs/{ids['flaky']}").get_json()
    assert job["timings"]["gpu_s"] == pytest.approx(flaky.text_gpu_s, abs=1e-3)


def test_usage_grouped_by_modality_model_and_day(client, sessions, scenario) -> None:
    ids = {k: uuid.UUID(v) for k, v in scenario["ids"].items()}
    rows = _rows(sessions, DEFAULT_TENANT_ID)
    leader, flaky = rows[ids["leader"]], rows[ids["flaky"]]

    by_modality = _usage(client, **scenario["window"], group_by="modality")
    groups = {g["key"]: g for g in by_modality["groups"]}
    assert list(groups) == ["text", "video"]
    assert groups["video"]["jobs"] == _jobs(3, succeeded=3) and groups["video"]["cache_hits"] == 2
    assert groups["video"]["frames"] == 5 and groups["video"]["tokens"] == leader.tokens_generated
    assert groups["text"]["jobs"] == _jobs(2, succeeded=1, failed=1) and groups["text"]["frames"] == 0
    assert groups["text"]["gpu_s"]["video"] == 0
    assert groups["text"]["gpu_s"]["text"] == pytest.approx(
        flaky.text_gpu_s + rows[ids["failed"]].text_gpu_s, abs=1e-5
    )

    by_model = _usage(client, **scenario["window"], group_by="model")
    groups = {g["key"]: g for g in by_model["groups"]}
    assert list(groups) == [f"text:{TEXT_MODEL}", "text:-", "video:echo", "video:-"]  # "-" (none) last
    text = groups[f"text:{TEXT_MODEL}"]
    assert (text["stage"], text["model"]) == ("text", TEXT_MODEL)
    assert text["jobs"] == _jobs(3, succeeded=2, failed=1) and text["frames"] == 0
    assert text["gpu_s"]["text"] == pytest.approx(by_model["total"]["gpu_s"]["text"], abs=1e-5)
    assert text["tokens"] == by_model["total"]["tokens"]
    assert groups["text:-"]["jobs"] == _jobs(2, succeeded=2) and groups["text:-"]["cache_hits"] == 2
    assert groups["text:-"]["model"] is None and groups["text:-"]["gpu_s"]["total"] == 0
    video = groups["video:echo"]
    assert video["jobs"] == _jobs(1, succeeded=1) and video["frames"] == 5 and video["tokens"] == 0
    assert video["gpu_s"] == {"text": 0, "video": pytest.approx(leader.video_gpu_s, abs=1e-5), "image": 0,
                              "total": pytest.approx(leader.video_gpu_s, abs=1e-5)}  # fmt: skip
    assert groups["video:-"]["jobs"] == _jobs(2, succeeded=2)

    # The failed job was submitted two days earlier: its own day, and outside a shorter window.
    two_days_ago = datetime.now(UTC) - timedelta(days=2)
    with transaction(sessions) as s:
        s.execute(update(Job).where(Job.id == ids["failed"]).values(created_at=two_days_ago))
    wide = {"from": _iso(two_days_ago - timedelta(hours=1)), "to": scenario["window"]["to"]}
    by_day = _usage(client, **wide, group_by="day")
    days = {g["key"]: g["jobs"] for g in by_day["groups"]}
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    assert days == {two_days_ago.strftime("%Y-%m-%d"): _jobs(1, failed=1), today: _jobs(4, succeeded=4)}
    assert list(days) == sorted(days)
    assert _usage(client, **scenario["window"])["total"]["jobs"] == _jobs(4, succeeded=4)


def test_a_tenant_sees_only_its_own_usage(client, scenario) -> None:
    beta = scenario["beta"]
    mine = _usage(beta, **scenario["window"], group_by="model")
    assert mine["total"]["jobs"] == _jobs(1, succeeded=1)
    assert mine["total"]["cache_hits"] == 0 and mine["total"]["frames"] == 0
    assert mine["total"]["tokens"] == 4  # "Shot: beta words here"
    assert [g["key"] for g in mine["groups"]] == [f"text:{TEXT_MODEL}"]  # a text job has no video row
    # No way to name another tenant: the key decides.
    resp = beta.get("/v1/usage", query_string={"tenant": DEFAULT_TENANT_NAME})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["field"] == "tenant"
    theirs = _usage(client, **scenario["window"])
    assert theirs["total"]["jobs"]["total"] == 5  # A's own five, not B's one


def test_the_cli_prints_the_same_usage(client, settings, scenario, monkeypatch) -> None:
    monkeypatch.setenv("DATABASE_URL", settings.database_url)
    window = scenario["window"]
    args = ["usage", "--tenant", DEFAULT_TENANT_NAME, "--from", window["from"], "--to", window["to"]]
    result = CliRunner().invoke(main, [*args, "--group-by", "model"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    api = _usage(client, **window, group_by="model")
    assert json.loads(result.output) == {"tenant": DEFAULT_TENANT_NAME, **api}
    result = CliRunner().invoke(main, [*args, "--format", "table", "--group-by", "modality"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[1].split()[:4] == ["KEY", "JOBS", "SUCCEEDED", "FAILED"]
    assert [line.split()[:4] for line in lines[2:]] == [
        ["text", "2", "1", "1"], ["video", "3", "3", "0"], ["TOTAL", "5", "4", "1"],
    ]  # fmt: skip
    tokens = str(api["total"]["tokens"])
    assert lines[-1].split()[-4:] == [tokens, "5", "0", "2"]  # tokens, frames, images, hits
    unknown = CliRunner().invoke(main, ["usage", "--tenant", "nobody"])
    assert unknown.exit_code != 0 and "no tenant 'nobody'" in unknown.output
    bad = CliRunner().invoke(main, ["usage", "--tenant", "x", "--from", "yesterday"])
    assert bad.exit_code == 2 and "ISO 8601" in bad.output


# --- validation ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("query", "field"),
    [
        ({"from": "yesterday"}, "from"),
        ({"to": "2026-13-01T00:00:00Z"}, "to"),
        ({"from": ""}, "from"),
        ({"from": "1733000000"}, "from"),  # a number is not a time here
        ({"from": "2026-12-02T00:00:00Z", "to": "2026-12-01T00:00:00Z"}, "to"),
        ({"from": "2026-12-01T00:00:00Z", "to": "2026-12-01T00:00:00Z"}, "to"),
        ({"from": "2024-01-01T00:00:00Z", "to": "2025-01-02T00:00:00Z"}, "to"),  # 367 days
        ({"from": "2000-01-01T00:00:00Z"}, "to"),  # up to now: far more than 366 days
        ({"to": "0001-01-01T00:00:00Z"}, "to"),  # no room for the default window before it
        ({"to": "0001-01-01T00:00:00+01:00"}, "to"),
        ({"group_by": "week"}, "group_by"),
        ({"group_by": ""}, "group_by"),
        ({"tenant": "other"}, "tenant"),
    ],
)
def test_bad_queries_are_422_naming_the_field(client, query, field) -> None:
    resp = client.get("/v1/usage", query_string=query)
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json", resp.get_data()
    assert [e["field"] for e in resp.get_json()["errors"]] == [field], resp.get_json()


def test_window_defaults_and_accepted_forms(client) -> None:
    body = _usage(client)
    start, end = (datetime.fromisoformat(body[k].replace("Z", "+00:00")) for k in ("from", "to"))
    assert end - start == timedelta(days=30) and abs(end - datetime.now(UTC)) < timedelta(minutes=1)
    assert body["total"]["jobs"]["total"] == 0 and body["total"]["gpu_s"]["total"] == 0
    exact = _usage(client, **{"from": "2025-01-01T01:00:00+01:00", "to": "2026-01-02"})  # 366 days
    assert (exact["from"], exact["to"]) == ("2025-01-01T00:00:00Z", "2026-01-02T00:00:00Z")
    assert _usage(client, **{"to": "2026-12-01t10:00:00z"})["to"] == "2026-12-01T10:00:00Z"


def test_usage_needs_a_key(anon_client) -> None:
    assert anon_client.get("/v1/usage").status_code == 401


# --- the meter ----------------------------------------------------------------------------------


def test_a_batched_call_charges_each_request_its_share() -> None:
    """Two requests sharing one 0.4 s call are charged 0.2 s each: the call counts once."""

    def run(batch: list[Any]) -> list[Any]:
        time.sleep(0.4)
        return [item.request for item in batch]

    batcher = MicroBatcher("meter-test", run, max_size=2, max_wait_s=0.5)
    meters = [Meter(), Meter()]
    batcher.expect()
    batcher.expect()

    def call(i: int) -> None:
        batcher.submit(i, deadline=time.monotonic() + 10, meter=meters[i], expected=True)

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert batcher.sizes[2] == 1  # one shared call
    assert meters[0].seconds == pytest.approx(meters[1].seconds)
    assert 0.4 <= meters[0].seconds + meters[1].seconds < 0.6


def test_a_caller_that_stops_waiting_is_charged_its_share_so_far() -> None:
    """A deadline (or a cancel) ends the caller's wait while its call runs: it is charged up to then."""
    from celery.exceptions import SoftTimeLimitExceeded

    release = threading.Event()

    def run(batch: list[Any]) -> list[Any]:
        release.wait(5)
        return [item.request for item in batch]

    batcher = MicroBatcher("meter-leave", run, max_size=1, max_wait_s=0)
    meter = Meter()
    with pytest.raises(SoftTimeLimitExceeded):
        batcher.submit("x", deadline=time.monotonic() + 0.3, meter=meter)
    charged = meter.seconds
    release.set()
    assert 0.2 <= charged < 0.6
    time.sleep(0.1)  # the call has ended meanwhile: its end is not charged twice
    assert meter.seconds == charged


def test_an_attempt_canceled_mid_run_is_charged(client, settings, sessions, broker, monkeypatch) -> None:
    monkeypatch.setenv("GENQUEUE_ECHO_STEP_SECONDS", "0.1")
    params = VIDEO | {"steps": 100}
    body = {"prompt": f"a long shot {uuid.uuid4().hex}", "modality": "video", "params": params}
    start = datetime.now(UTC)
    with thread_workers(settings):
        jid = client.post("/v1/jobs", json=body).get_json()["id"]
        # Progress runs from 20 to 95 over the 100 steps: 24 is at least 5 steps (0.5 s) in.
        wait_until(sessions, uuid.UUID(jid), lambda j: j.stage == "video" and j.progress >= 24, 60)
        assert client.post(f"/v1/jobs/{jid}/cancel").status_code == 200
        row = wait_until(sessions, uuid.UUID(jid), lambda j: j.video_gpu_s is not None, 30, "the charge")
    assert row.status == "canceled" and row.frames_rendered is None
    assert 0.4 <= row.video_gpu_s <= (row.updated_at - row.started_at).total_seconds()
    end = datetime.now(UTC) + timedelta(minutes=1)
    window = {"from": _iso(start - timedelta(minutes=1)), "to": _iso(end)}
    total = _usage(client, **window)["total"]
    assert total["jobs"] == _jobs(1, canceled=1) and total["frames"] == 0
    assert total["gpu_s"]["video"] == pytest.approx(row.video_gpu_s, abs=1e-5)
    assert total["gpu_s"]["text"] == pytest.approx(row.text_gpu_s, abs=1e-5)
