"""Rejections counted by status, problem type and reason (genqueue_http_problems_total), labels bounded."""

from __future__ import annotations

import uuid
from typing import Any

from flask import Flask
from flask.testing import FlaskClient
from prometheus_client.parser import text_string_to_metric_families

from app.errors import REASONS, ApiError
from app.metrics import problem_labels
from models import Job, JobStatus
from models.base import utcnow
from models.db import transaction
from tests.support.api import assert_problem, authed_client_class, make_api_key, submit

PROBLEMS = "genqueue_http_problems_total"


def problems(app: Flask) -> dict[tuple[str, str, str], float]:
    """{(status, type, reason): count} as /metrics shows them."""
    text = app.test_client().get("/metrics").get_data(as_text=True)
    return {
        (s.labels["status"], s.labels["type"], s.labels["reason"]): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == PROBLEMS
    }


def add_jobs(sessions, n: int, **fields: Any) -> None:
    with transaction(sessions) as s:
        s.add_all([Job(**({"modality": "text", "prompt": "p", "params": {}} | fields)) for _ in range(n)])


def client_of(app: Flask, key: str) -> Any:
    return authed_client_class(key)(app, app.response_class, True)


def test_429_is_counted_by_which_limit(make_app, sessions):
    app = make_app()
    rate = client_of(app, make_api_key(sessions, "fast", rate_limit="2/second;100/minute"))
    for _ in range(3):
        rate.get("/v1/jobs")
    quota = client_of(app, make_api_key(sessions, "busy", max_active_jobs=1))
    assert submit(quota).status_code == 202
    assert_problem(submit(quota), 429)
    assert_problem(submit(quota), 429)
    seen = problems(app)
    assert seen[("429", "rate-limited", "rate")] == 1
    assert seen[("429", "concurrency-limit", "active_jobs")] == 2


def test_503_is_counted_by_admission_reason(make_app, sessions, settings):
    add_jobs(sessions, 2)
    text = make_app(admission_max_text_backlog=2, admission_cache_s=0)
    assert_problem(submit(text.test_client()), 503)
    assert problems(text) == {("503", "overloaded", "text_backlog"): 1}
    add_jobs(sessions, 1, modality="video", status=JobStatus.RUNNING, stage="video")
    video = make_app(admission_max_video_backlog=1, admission_cache_s=0)
    assert_problem(submit(video.test_client(), modality="video"), 503)
    assert_problem(submit(video.test_client(), modality="video"), 503)
    assert problems(video) == {("503", "overloaded", "video_backlog"): 2}

    waits = make_app(admission_max_wait_s=1, admission_cache_s=0)
    with transaction(sessions) as s:  # 1 job finished per second, 3 active: about 3 s of wait
        s.add_all(
            Job(modality="text", prompt="p", params={}, status=JobStatus.SUCCEEDED, completed_at=utcnow())
            for _ in range(60)
        )
    assert_problem(submit(waits.test_client()), 503)
    assert problems(waits)[("503", "overloaded", "estimated_wait")] == 1

    # The broker down: the publish fails (the quota store still answers), and readiness says so.
    dead = make_app(broker_url="redis://127.0.0.1:1/0", ratelimit_url=settings.broker_url)
    assert_problem(submit(dead.test_client()), 503)
    assert_problem(dead.test_client().get("/v1/ready"), 503)
    seen = problems(dead)
    assert seen[("503", "service-unavailable", "broker")] == 1
    assert seen[("503", "service-unavailable", "not_ready")] == 1


def test_database_outage_is_counted_as_a_dependency(make_app):
    app = make_app(database_url="postgresql+psycopg://postgres@127.0.0.1:1/none", auth_cache_s=0)
    assert_problem(app.test_client().get("/v1/jobs"), 503)
    assert problems(app) == {("503", "service-unavailable", "dependency"): 1}


def test_4xx_are_counted_by_problem_type(make_app):
    app = make_app()
    client = app.test_client()
    assert_problem(client.post("/v1/jobs", json={"prompt": "", "modality": "text"}), 422)
    assert_problem(client.get(f"/v1/jobs/{uuid.uuid4()}"), 404)
    assert_problem(client.post("/v1/jobs", data="x", content_type="text/plain"), 415)
    assert_problem(client.delete("/v1/jobs"), 405)
    assert_problem(FlaskClient(app, app.response_class, True).get("/v1/jobs"), 401)  # no key
    assert problems(app) == {
        ("422", "validation-failed", ""): 1,
        ("404", "not-found", ""): 1,
        ("415", "unsupported-media-type", ""): 1,
        ("405", "about:blank", ""): 1,
        ("401", "unauthorized", ""): 1,
    }


def _subclasses(cls: type[ApiError]) -> list[type[ApiError]]:
    return [cls, *(c for sub in cls.__subclasses__() for c in _subclasses(sub))]


def test_label_values_come_from_the_error_classes_only():
    """Every type label is a slug of the error hierarchy (or about:blank), every reason from REASONS;
    a reason outside the vocabulary (typing bypassed) is folded into "other", not passed through."""
    slugs = {c.slug for c in _subclasses(ApiError) if c.slug} | {"about:blank"}
    assert {"rate-limited", "concurrency-limit", "overloaded", "validation-failed"} <= slugs
    for cls in _subclasses(ApiError):
        status, type_, reason = problem_labels(cls())
        assert type_ in slugs and reason in REASONS and status.isdigit()
    err = ApiError("x")
    err.reason = "free text from somewhere"  # type: ignore[assignment]
    assert problem_labels(err)[2] == "other"


def test_successful_requests_record_no_problem(app):
    client = app.test_client()
    client.get("/v1/health")
    client.get("/v1/jobs")
    assert problems(app) == {}
