"""Idempotency-Key on POST /v1/jobs against the real Postgres: replays, conflicts, races, expiry."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import func, select, update

from app import create_app
from models import IdempotencyKey, Job
from models.base import utcnow

BODY = {"prompt": "a fox", "modality": "text"}
CLOSED_BROKER = "redis://127.0.0.1:1/0"


def _post(client, body=BODY, key: str | None = "key-1"):
    headers = {"Idempotency-Key": key} if key is not None else {}
    return client.post("/v1/jobs", json=body, headers=headers)


def _count(sessions, model=Job) -> int:
    with sessions() as s:
        return s.scalar(select(func.count()).select_from(model)) or 0


def test_a_repeat_returns_the_original_job(client, sessions):
    first = _post(client)
    again = _post(client, {"modality": "text", "prompt": "a fox"})  # same body, other key order
    assert first.status_code == again.status_code == 202
    assert first.get_json()["id"] == again.get_json()["id"]
    assert again.headers["Idempotent-Replayed"] == "true" and "Idempotent-Replayed" not in first.headers
    assert again.headers["Location"] == first.headers["Location"]
    assert _count(sessions) == 1


def test_a_repeat_with_another_body_is_422_and_writes_nothing(client, sessions):
    _post(client)
    resp = _post(client, {**BODY, "prompt": "a wolf"})
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    assert resp.get_json()["errors"][0]["field"] == "Idempotency-Key"
    assert _count(sessions) == 1


def test_keys_are_independent_and_optional(client, sessions):
    ids = {_post(client, key=k).get_json()["id"] for k in ("a", "b", None, None)}
    assert len(ids) == 4 and _count(sessions) == 4


@pytest.mark.parametrize("key", ["", "x" * 256, "caf\u00e9", "tab\there"])
def test_a_malformed_key_is_422_naming_the_header(client, sessions, key):
    resp = _post(client, key=key)
    assert resp.status_code == 422
    assert [e["field"] for e in resp.get_json()["errors"]] == ["Idempotency-Key"]
    assert _count(sessions) == 0


def test_a_255_character_key_is_accepted_and_kept_24_hours(client, sessions):
    assert _post(client, key="k" * 255).status_code == 202
    with sessions() as s:
        row = s.scalars(select(IdempotencyKey)).one()
    assert timedelta(hours=24) <= row.expires_at - row.created_at < timedelta(hours=25)


def test_100_concurrent_identical_requests_create_one_job(settings, sessions, broker, api_key):
    from tests.support.api import authed_client_class

    overrides = {
        "db_pool_size": 20, "db_max_overflow": 0, "db_connect_timeout_s": 60,
        "plan_rate_limit": "100000/second",
    }  # fmt: skip
    flask_app = create_app(settings.model_copy(update=overrides))
    flask_app.test_client_class = authed_client_class(api_key)
    barrier = threading.Barrier(100)
    results: list[tuple[int, str]] = []
    lock = threading.Lock()

    def one() -> None:
        client = flask_app.test_client()
        barrier.wait()
        resp = _post(client, key="race")
        with lock:
            results.append((resp.status_code, (resp.get_json() or {}).get("id")))

    threads = [threading.Thread(target=one) for _ in range(100)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    flask_app.extensions["genqueue"].engine.dispose()
    assert len(results) == 100
    assert {code for code, _ in results} == {202}
    assert len({jid for _, jid in results}) == 1
    assert _count(sessions) == 1 and _count(sessions, IdempotencyKey) == 1


def test_an_expired_key_can_be_used_again(client, sessions):
    first = _post(client).get_json()["id"]
    with sessions.begin() as s:
        s.execute(update(IdempotencyKey).values(expires_at=utcnow() - timedelta(seconds=1)))
    second = _post(client, {**BODY, "prompt": "something else"})
    assert second.status_code == 202 and second.get_json()["id"] != first
    assert _count(sessions) == 2 and _count(sessions, IdempotencyKey) == 1


def test_a_job_that_could_not_be_queued_frees_its_key(settings, sessions, broker, api_key):
    from tests.support.api import authed_client_class

    down = create_app(settings.model_copy(update={"broker_url": CLOSED_BROKER}))
    down.test_client_class = authed_client_class(api_key)
    assert _post(down.test_client()).status_code == 503
    down.extensions["genqueue"].engine.dispose()
    assert _count(sessions) == 0 and _count(sessions, IdempotencyKey) == 0
    up = create_app(settings)
    up.test_client_class = authed_client_class(api_key)
    assert _post(up.test_client()).status_code == 202
    up.extensions["genqueue"].engine.dispose()


def test_keys_are_per_tenant(client, tenant_client, sessions):
    mine = _post(client, key="shared-key")
    theirs = _post(tenant_client("acme"), key="shared-key")
    assert mine.status_code == theirs.status_code == 202
    assert mine.get_json()["id"] != theirs.get_json()["id"]
    assert "Idempotent-Replayed" not in theirs.headers
    assert _count(sessions) == 2
