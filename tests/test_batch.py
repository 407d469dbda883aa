"""POST /v1/jobs/batch against the real Postgres and Redis: errors by index, all or nothing, the
Idempotency-Key, every job counted by quota and admission, and each job like a single submit
through real workers (pipeline, cache, priorities, cancel)."""

from __future__ import annotations

import threading
import uuid
from typing import Any

import pytest
from sqlalchemy import func, select, text

from app import server
from models import IdempotencyKey, Job
from models.tenant import DEFAULT_TENANT_ID
from tests.support.api import assert_problem, authed_client_class, make_api_key, submit
from tests.support.jobs import FINISHED, broker_messages, events, wait_all_done
from tests.support.procs import wait_for
from tests.support.workers import thread_workers

TEXT = {"prompt": "a fox", "modality": "text"}
SMALL = {"width": 64, "height": 64, "num_frames": 5, "steps": 2}
VIDEO = {"prompt": "a fox in the snow", "modality": "video", "params": SMALL}
IMAGE_SMALL = {"width": 64, "height": 96, "steps": 3}
IMAGE = {"prompt": "a lighthouse at dusk", "modality": "image", "params": IMAGE_SMALL}


def post(client, jobs: list[Any], key: str | None = None, **body: Any):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post("/v1/jobs/batch", json={"jobs": jobs, **body}, headers=headers)


def count(sessions, model: Any = Job) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def ids(resp) -> list[str]:
    assert resp.status_code == 202, resp.get_data(as_text=True)
    return [j["id"] for j in resp.get_json()["jobs"]]


# --- the answer ----------------------------------------------------------------------------------


def test_a_batch_answers_202_with_its_jobs_in_order(client, sessions, broker):
    jobs = [TEXT | {"prompt": f"fox {i}"} for i in range(3)] + [VIDEO]
    resp = post(client, jobs)
    body = resp.get_json()
    assert resp.status_code == 202 and list(body) == ["jobs"]
    assert [j["prompt"] for j in body["jobs"]] == ["fox 0", "fox 1", "fox 2", "a fox in the snow"]
    assert all(j["status"] == "queued" and j["object"] == "job" for j in body["jobs"])
    # Complete params, as a single submit stores them: the defaults filled, a seed drawn.
    assert {"seed", "max_new_tokens", "temperature"} <= body["jobs"][0]["params"].keys()
    assert body["jobs"][3]["params"]["fps"] == 8
    assert [j["queue_position"] for j in body["jobs"]] == [1, 2, 3, 4]
    assert count(sessions) == 4
    for j in body["jobs"]:  # each job as GET answers it
        assert client.get(f"/v1/jobs/{j['id']}").get_json()["prompt"] == j["prompt"]
    assert len(broker_messages(broker, "text")) == 4  # one message per job, none for the batch


@pytest.mark.parametrize("job", [
    VIDEO | {"params": SMALL | {"seed": 7, "variants": ["webm"]}, "metadata": {"k": "v"}, "priority": "high",
             "webhook": {"url": "http://127.0.0.1:9/hook"}, "cache": False},
    TEXT | {"cache": False},  # no seed, webhook, variants or metadata: the nullable columns left out
])  # fmt: skip
def test_a_batch_job_is_stored_as_a_single_submit_stores_it(make_app, sessions, broker, job):
    client = make_app(webhook_allow_private=True).test_client()
    resp = submit(client, **job)
    assert resp.status_code == 202, resp.get_data(as_text=True)
    single = resp.get_json()["id"]
    batched = ids(post(client, [job, job]))
    with sessions() as s:
        rows = {
            str(r["id"]): r
            for r in s.execute(select(Job.__table__).where(Job.id.in_([single, *batched]))).mappings()
        }
        # SQL NULL, not a JSON null, where a job has no webhook or variants
        none = (Job.webhook.is_(None), Job.variants.is_(None))
        nulls = s.execute(select(Job.id).where(Job.id.in_([single, *batched]), *none)).all()
    differ = {"id", "created_at", "updated_at", "queue_seq", "published_at", "params"}
    for jid in batched:
        same = {k: v for k, v in rows[jid].items() if k not in differ}
        assert same == {k: v for k, v in rows[single].items() if k not in differ}
        assert rows[jid]["params"] | {"seed": 0} == rows[single]["params"] | {"seed": 0}  # seeds drawn apart
        assert rows[jid]["queue_seq"] > rows[single]["queue_seq"]
    assert len(nulls) == (0 if "webhook" in job else 3)


def test_a_batchs_published_marks_touch_no_index(sessions):
    # jobs has fillfactor 50 (migration 0015): each row's first update finds room on its page and
    # changes no indexed column, so it is heap-only (HOT). In full pages it was not, and each mark
    # wrote an entry in each of the table's indexes.
    from models import job_writes
    from models.base import utcnow

    now = utcnow()
    fixed = {"tenant_id": DEFAULT_TENANT_ID, "status": "queued", "modality": "text", "priority": "normal",
             "progress": 0, "meta": {}, "attempts": 0, "recoveries": 0, "cached": False, "created_at": now,
             "updated_at": now}  # fmt: skip
    jobs = [
        job_writes.new_job(id=uuid.uuid4(), prompt=f"a fox {i} " * 20, params={"seed": i}, **fixed)
        for i in range(500)
    ]
    with sessions() as s, s.begin():
        job_writes.insert_many(s, jobs)
        assert job_writes.mark_published_many(s, [j.id for j in jobs]) == 500
        hot = s.scalar(text("SELECT pg_stat_get_xact_tuples_hot_updated('jobs'::regclass)"))
    assert hot == 500


def test_positions_follow_priority_then_order(client):
    assert submit(client).status_code == 202  # one normal job queued before the batch
    jobs = [TEXT | {"priority": p} for p in ("low", "normal", "high", "normal")]
    positions = [j["queue_position"] for j in post(client, jobs).get_json()["jobs"]]
    assert positions == [5, 3, 1, 4]  # high first, then normal by age (the batch's in its order)


def test_a_read_places_batch_jobs_by_their_enqueue_numbers(make_app):
    client = make_app(queue_position_ttl_s=0).test_client()  # the lanes re-read on every request
    assert submit(client).status_code == 202
    jobs = [TEXT | {"priority": p} for p in ("low", "normal", "high", "normal")]
    answered = post(client, jobs).get_json()["jobs"]
    # The trigger numbered the multi-row INSERT's jobs of one priority in their order (app.queue).
    assert [client.get(f"/v1/jobs/{j['id']}").get_json()["queue_position"] for j in answered] == [5, 3, 1, 4]


def test_a_batch_may_be_larger_than_a_single_body(client, sessions, settings):
    jobs = [TEXT | {"prompt": f"{i} " + "a long prompt " * 20} for i in range(500)]  # ~150 KB
    assert len(ids(post(client, jobs))) == 500 and count(sessions) == 500
    big = [TEXT | {"prompt": "x" * 3999}] * 500
    too_large = client.post(
        "/v1/jobs/batch", json={"jobs": big + big + big}, headers={"Content-Type": "application/json"}
    )
    assert assert_problem(too_large, 413)["errors"][0]["field"] == "body"


def test_the_gunicorn_worker_reads_a_batch_body_whole(settings, sessions, broker, api_key, tmp_path):
    import httpx

    from tests.support.procs import gunicorn_web

    assert server.BATCH_PATH == "/v1/jobs/batch"
    jobs = [TEXT | {"prompt": f"{i} " + "a long prompt " * 20} for i in range(300)]  # ~90 KB
    with gunicorn_web(settings, tmp_path / "web.log") as base:
        auth = {"Authorization": f"Bearer {api_key}"}
        resp = httpx.post(f"{base}/v1/jobs/batch", json={"jobs": jobs}, headers=auth)
        assert resp.status_code == 202, resp.text
        # Every other route keeps max_body_bytes.
        single = httpx.post(f"{base}/v1/jobs", json=jobs[0] | {"prompt": "x" * 70_000}, headers=auth)
        assert single.status_code == 413
    assert count(sessions) == 300


# --- validation ----------------------------------------------------------------------------------


def test_every_invalid_job_is_named_by_index_and_nothing_is_written(client, sessions, broker):
    jobs = [
        TEXT,
        VIDEO | {"params": {"width": 100}},
        TEXT | {"params": {"width": 64}},
        "not an object",
        {"prompt": "   ", "modality": "video"},
        TEXT | {"modality": "audio"},
        IMAGE | {"params": {"num_images": 9}},
        IMAGE | {"params": {"num_frames": 5}},
    ]
    body = assert_problem(post(client, jobs), 422)
    fields = [e["field"] for e in body["errors"]]
    assert fields == [
        "jobs[1].params.width", "jobs[2].params.width", "jobs[3]", "jobs[4].prompt", "jobs[5].modality",
        "jobs[6].params.num_images", "jobs[7].params.num_frames",
    ]  # fmt: skip
    messages = {e["field"]: e["message"] for e in body["errors"]}
    # As a single submit says them.
    assert messages["jobs[2].params.width"] == "only valid for video, image and storyboard jobs"
    assert messages["jobs[5].modality"] == "must be one of: text, video, image, storyboard"
    assert messages["jobs[7].params.num_frames"] == "only valid for video and storyboard jobs"
    assert "7 of the 8 jobs" in body["detail"]
    assert count(sessions) == 0 and not broker_messages(broker, "text")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({}, "jobs"),
        ({"jobs": []}, "jobs"),
        ({"jobs": [TEXT] * 501}, "jobs"),
        ({"jobs": TEXT}, "jobs"),
        ({"jobs": [TEXT], "extra": 1}, "extra"),
        ([TEXT], "body"),
    ],
)
def test_a_malformed_batch_is_422_naming_the_envelope(client, sessions, body, field):
    resp = client.post("/v1/jobs/batch", json=body)
    assert [e["field"] for e in assert_problem(resp, 422)["errors"]] == [field]
    assert count(sessions) == 0


def test_a_job_beyond_the_plan_refuses_the_whole_batch(tenant_client, sessions):
    client = tenant_client("acme", max_width=128)
    resp = post(client, [VIDEO, VIDEO | {"params": {"width": 256}}, VIDEO])
    body = assert_problem(resp, 403)
    assert [e["field"] for e in body["errors"]] == ["jobs[1].params.width"]
    assert body["limits"] == {"max_width": 128}
    assert count(sessions) == 0
    # An image job's size is bounded as a single submit's is, named by its index.
    body = assert_problem(post(client, [TEXT, IMAGE, IMAGE | {"params": {"width": 256}}]), 403)
    assert [e["field"] for e in body["errors"]] == ["jobs[2].params.width"]
    assert count(sessions) == 0


def test_batch_jobs_name_their_models_checked_by_index(client, tenant_client, sessions):
    body = assert_problem(post(client, [TEXT | {"model": "echo"}, TEXT | {"model": "nope"}]), 422)
    [error] = body["errors"]
    assert error["field"] == "jobs[1].model", error
    assert error["message"].startswith("unknown text model 'nope'")  # as a single submit says it
    assert count(sessions) == 0
    jobs = post(client, [TEXT, TEXT | {"model": "echo"}, VIDEO | {"model": {"text": "echo"}}]).get_json()
    asked = [{stage: m["asked"] for stage, m in j["models"].items()} for j in jobs["jobs"]]
    assert asked == [{"text": None}, {"text": "echo"}, {"text": "echo", "video": None}]
    with sessions() as s:  # stored for every job, the first naming none (one multi-row INSERT)
        stored = {str(j.id): j.models for j in s.scalars(select(Job))}
    assert [stored[j["id"]] for j in jobs["jobs"]] == [
        {"text": {"asked": a["text"]}} | ({"video": {"asked": None}} if "video" in a else {}) for a in asked
    ]
    # The plan's allowed_models limits each job's models, defaults included, named by index.
    smollm2_only = tenant_client("smollm2-only", allowed_models="smollm2")  # the default here is echo
    body = assert_problem(post(smollm2_only, [TEXT | {"model": "smollm2"}, TEXT]), 403)
    assert [e["field"] for e in body["errors"]] == ["jobs[1].model.text"]
    assert body["limits"] == {"allowed_models": "smollm2"}


# --- the Idempotency-Key -------------------------------------------------------------------------


def test_a_repeat_returns_the_same_jobs(client, sessions):
    jobs = [TEXT | {"prompt": f"fox {i}"} for i in range(5)]
    first = post(client, jobs, key="batch-1")
    again = post(client, jobs, key="batch-1")
    assert ids(first) == ids(again) and again.headers["Idempotent-Replayed"] == "true"
    assert "Idempotent-Replayed" not in first.headers
    assert count(sessions) == 5 and count(sessions, IdempotencyKey) == 1
    other = post(client, jobs[:4], key="batch-1")  # another body: a 422, as on POST /v1/jobs
    assert assert_problem(other, 422)["errors"][0]["field"] == "Idempotency-Key"
    assert client.post("/v1/jobs", json=TEXT, headers={"Idempotency-Key": "batch-1"}).status_code == 422
    assert count(sessions) == 5


def test_concurrent_identical_batches_create_one_set_of_jobs(settings, sessions, broker, api_key):
    from app import create_app

    overrides = {"db_pool_size": 10, "db_max_overflow": 0, "plan_rate_limit": "100000/second"}
    flask_app = create_app(settings.model_copy(update=overrides))
    flask_app.test_client_class = authed_client_class(api_key)
    barrier, answers, lock = threading.Barrier(10), [], threading.Lock()
    jobs = [TEXT | {"prompt": f"fox {i}"} for i in range(20)]

    def one() -> None:
        client = flask_app.test_client()
        barrier.wait()
        resp = post(client, jobs, key="race")
        with lock:
            answers.append((resp.status_code, tuple(j["id"] for j in resp.get_json()["jobs"])))

    threads = [threading.Thread(target=one) for _ in range(10)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    flask_app.extensions["genqueue"].engine.dispose()
    assert {code for code, _ in answers} == {202} and len(answers) == 10
    assert len({jids for _, jids in answers}) == 1
    assert count(sessions) == 20 and count(sessions, IdempotencyKey) == 1


# --- quota, admission, rate limit: every job counts -----------------------------------------------


def test_the_quota_counts_every_job_of_a_batch(tenant_client, sessions):
    client = tenant_client("acme", max_active_jobs=5)
    assert len(ids(post(client, [TEXT] * 3))) == 3
    body = assert_problem(post(client, [TEXT] * 3), 429)  # 2 slots left: the whole batch is refused
    assert body["type"].endswith("concurrency-limit") and "needs 3" in body["detail"]
    assert count(sessions) == 3
    assert len(ids(post(client, [TEXT] * 2))) == 2
    assert_problem(submit(client), 429)  # a single submit sees the batch's slots taken


def test_the_backlog_bounds_count_every_job_of_a_batch(make_app, sessions):
    client = make_app(
        admission_max_text_backlog=5, admission_max_video_backlog=2, admission_cache_s=0
    ).test_client()
    assert assert_problem(post(client, [TEXT] * 6), 503)["stage"] == "text"
    assert assert_problem(post(client, [VIDEO] * 3), 503)["stage"] == "video"
    assert count(sessions) == 0
    assert len(ids(post(client, [TEXT] * 3 + [VIDEO] * 2))) == 5
    assert assert_problem(submit(client), 503)["stage"] == "text"


def test_the_image_backlog_counts_every_image_job_of_a_batch(make_app, sessions):
    app = make_app(admission_max_image_backlog=2, admission_cache_s=0)
    client = app.test_client()
    assert assert_problem(post(client, [TEXT, IMAGE, IMAGE, IMAGE]), 503)["stage"] == "image"
    assert count(sessions) == 0
    assert len(ids(post(client, [IMAGE, TEXT, VIDEO, IMAGE]))) == 4  # exactly at the bound
    assert assert_problem(submit(client, **IMAGE), 503)["stage"] == "image"  # a single submit sees them
    assert len(ids(post(client, [TEXT, VIDEO]))) == 2  # the other stages still admit
    metrics = client.get("/metrics").get_data(as_text=True)
    assert 'reason="image_backlog"' in metrics and 'status="503"' in metrics


def test_the_rate_limit_counts_the_request_once(tenant_client):
    client = tenant_client("acme", rate_limit="2/minute")
    resp = post(client, [TEXT] * 50)
    assert resp.status_code == 202 and resp.headers["RateLimit-Remaining"] == "1"


# --- failures ------------------------------------------------------------------------------------


def test_a_broker_outage_accepts_nothing_and_frees_key_and_slots(make_app, sessions, settings):
    key = make_api_key(sessions, "acme", max_active_jobs=3)
    dead = make_app(broker_url="redis://127.0.0.1:1/0", ratelimit_url=settings.broker_url)
    dead.test_client_class = authed_client_class(key)
    assert_problem(post(dead.test_client(), [TEXT] * 3, key="k"), 503)
    assert count(sessions) == 0 and count(sessions, IdempotencyKey) == 0
    live = make_app()
    live.test_client_class = authed_client_class(key)
    assert len(ids(post(live.test_client(), [TEXT] * 3, key="k"))) == 3  # slots and key free again


def test_jobs_left_unpublished_by_a_broken_publish_are_published_by_the_reaper(
    client, settings, sessions, broker, monkeypatch
):
    from datetime import timedelta

    from app import submission
    from models.base import utcnow
    from tasks.contract import publish
    from tasks.maintenance import reap
    from tasks.runtime import runtime

    def two_then_fail(app, jobs, published) -> None:
        publish.publish_jobs(app, list(jobs)[:2], published)
        raise ConnectionError("the broker went away")

    monkeypatch.setattr(submission, "publish_jobs", two_then_fail)
    jids = ids(post(client, [TEXT | {"prompt": f"fox {i}"} for i in range(5)]))  # accepted, whole
    assert len(broker_messages(broker, "text")) == 2 and count(sessions) == 5
    client.application.extensions["genqueue.published"].flush()
    with sessions() as s:
        unpublished = set(s.scalars(select(Job.id).where(Job.published_at.is_(None))))
    assert {str(j) for j in unpublished} == set(jids[2:])
    with thread_workers(settings) as app:
        later = utcnow() + timedelta(seconds=settings.publish_grace_s + 1)
        assert reap(runtime(app), app, now=later).get("requeued_unpublished") == 3
        done = wait_all_done(sessions, [uuid.UUID(j) for j in jids])
    assert {j.status for j in done.values()} == {"succeeded"}


# --- each job behaves like one submitted alone (real workers) ------------------------------------


def test_every_job_of_a_batch_runs_through_the_pipeline_once(client, settings, sessions, broker):
    jobs = [TEXT | {"prompt": f"fox {i}", "priority": p} for i, p in enumerate(["low", "normal", "high"])]
    jobs += [VIDEO | {"prompt": f"snow {i}"} for i in range(3)]
    jids = [uuid.UUID(j) for j in ids(post(client, jobs))]
    single = uuid.UUID(
        submit(client, modality="video", prompt="snow 9", params=VIDEO["params"]).get_json()["id"]
    )
    with thread_workers(settings):
        done = wait_all_done(sessions, [*jids, single])
        wait_for(lambda: all(client.get(f"/v1/jobs/{j}").get_json()["status"] in FINISHED for j in jids), 30)
    assert {j.status for j in done.values()} == {"succeeded"}
    for jid in jids:
        kind = done[jid].modality
        assert done[jid].attempts == 1 and done[jid].recoveries == 0
        # The same events, once each, as the single video job (text jobs skip the video stage).
        expected = events(sessions, single) if kind == "video" else None
        if expected is not None:
            assert events(sessions, jid) == expected
        assert events(sessions, jid).count("job.succeeded") == 1
    text = client.get(f"/v1/jobs/{jids[0]}/content?variant=text")
    assert text.status_code == 200 and text.get_data(as_text=True)


def test_a_batch_of_image_video_and_text_jobs_all_complete(client, settings, sessions):
    two = IMAGE | {"params": IMAGE_SMALL | {"num_images": 2}}
    jobs = [two, VIDEO, TEXT, IMAGE | {"prompt": "a barn"}]
    jids = [uuid.UUID(j) for j in ids(post(client, jobs))]
    with thread_workers(settings):
        done = wait_all_done(sessions, jids)
    assert [done[j].status for j in jids] == ["succeeded"] * 4
    assert [done[j].modality for j in jids] == ["image", "video", "text", "image"]
    # Each like its single submit: the image stage's columns for image jobs only.
    assert [done[j].images_rendered for j in jids] == [2, None, None, 1]
    assert done[jids[0]].image_model == "echo" and done[jids[1]].frames_rendered == 5
    assert [done[j].stage for j in jids] == ["image", "video", "text", "image"]
    first = client.get(f"/v1/jobs/{jids[0]}").get_json()
    assert [i["index"] for i in first["outputs"]["images"]] == [0, 1]
    png = client.get(first["outputs"]["images"][1]["png_url"])
    assert (png.status_code, png.mimetype) == (200, "image/png")
    video = client.get(f"/v1/jobs/{jids[1]}/content")
    assert (video.status_code, video.mimetype) == (200, "video/mp4")
    assert client.get(f"/v1/jobs/{jids[2]}/content").get_data(as_text=True)
    for jid in jids:
        assert events(sessions, jid).count("job.succeeded") == 1


def test_identical_seeded_jobs_in_a_batch_share_one_computation(client, settings, sessions):
    seeded = TEXT | {"prompt": "a seeded fox", "params": {"seed": 7}}
    first, second, other = post(client, [seeded, seeded, TEXT]).get_json()["jobs"]
    assert (first["cached"], second["cached"], second["source_job_id"]) == (False, True, first["id"])
    assert second["queue_position"] is None
    with thread_workers(settings):
        done = wait_all_done(sessions, [uuid.UUID(j["id"]) for j in (first, second, other)])
    assert {j.status for j in done.values()} == {"succeeded"}
    assert done[uuid.UUID(second["id"])].output_text == done[uuid.UUID(first["id"])].output_text
    again = post(client, [seeded]).get_json()["jobs"][0]  # now a finished result: a cache hit
    assert (again["status"], again["cached"]) == ("succeeded", True)


def test_one_job_of_a_batch_can_be_canceled(client, settings, sessions, broker):
    jids = ids(post(client, [TEXT | {"prompt": f"fox {i}"} for i in range(3)]))
    resp = client.post(f"/v1/jobs/{jids[1]}/cancel")
    assert resp.status_code == 200 and resp.get_json()["status"] == "canceled"
    with thread_workers(settings):
        done = wait_all_done(sessions, [uuid.UUID(j) for j in jids])
        wait_for(lambda: "job.compensated" in events(sessions, uuid.UUID(jids[1])), 30, what="compensation")
    statuses = [done[uuid.UUID(j)].status for j in jids]
    assert statuses == ["succeeded", "canceled", "succeeded"]
    assert done[uuid.UUID(jids[1])].started_at is None
    assert events(sessions, uuid.UUID(jids[1])) == ["job.canceled", "job.compensated"]


def test_a_batch_publishes_the_messages_single_publishes_do(celery_app, broker):
    from tasks.contract.publish import publish_job, publish_jobs

    def messages() -> dict[str, dict[str, Any]]:
        found = broker_messages(broker, "text")
        for m in found:
            m["properties"].pop("delivery_tag")  # kombu's, new for every message
        broker.flushdb()
        return {m["headers"]["id"]: m for m in found}

    jobs = [(uuid.uuid4(), "video", "high"), (uuid.uuid4(), "text", "low"), (uuid.uuid4(), "video", "normal")]
    for job in jobs:
        publish_job(celery_app, *job)
    alone = messages()
    sent: list[uuid.UUID] = []
    publish_jobs(celery_app, jobs, sent.extend)  # one producer, one pipeline, queues declared once
    assert sent == [j for j, _, _ in jobs]
    assert messages() == alone and len(alone) == 3


def test_a_batch_runs_in_the_embedded_mode(tmp_path) -> None:
    """SQLite (the multi-row VALUES INSERT) and the in-process broker (messages one by one)."""
    from flask.testing import FlaskClient

    from app import create_app
    from tasks.embedded import embedded_dev_key, embedded_settings, embedded_worker
    from tests.support.api import wait_finished

    settings = embedded_settings(tmp_path, text_model="echo", video_model="echo", worker_preload="")
    with embedded_worker(settings):
        headers = {"Authorization": f"Bearer {embedded_dev_key(settings)}"}
        flask_app = create_app(settings)
        client = FlaskClient(flask_app, flask_app.response_class)
        jobs = [TEXT | {"prompt": f"a haiku {i}", "metadata": {"n": str(i)}} for i in range(3)]
        resp = client.post("/v1/jobs/batch", json={"jobs": jobs}, headers=headers)
        assert resp.status_code == 202, resp.get_json()
        done = [wait_finished(client, j["id"], 30, headers=headers) for j in resp.get_json()["jobs"]]
        assert [(j["status"], j["metadata"]) for j in done] == [
            ("succeeded", {"n": str(i)}) for i in range(3)
        ]
        flask_app.extensions["genqueue"].engine.dispose()
