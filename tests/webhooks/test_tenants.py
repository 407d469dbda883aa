"""Webhooks per tenant: endpoints, secrets, delivery logs and replays are each tenant's own."""

from __future__ import annotations

import time
import uuid

import pytest
import sqlalchemy as sa
from alembic.script import ScriptDirectory
from flask.testing import FlaskClient
from sqlalchemy import select
from standardwebhooks.webhooks import WebhookVerificationError

from models import Job
from models.migrate import alembic_config, downgrade, upgrade
from models.tenant import DEFAULT_TENANT_ID
from models.webhook import WebhookDelivery, WebhookEndpoint, WebhookMessage
from tests.support.api import authed_client_class, make_api_key, wait_finished
from tests.webhooks.helpers import Receiver, deliveries, secret, serve, submit


def _tenant(hook_client: FlaskClient, sessions, name: str) -> FlaskClient:
    """A client of tenant `name` on the same app as `hook_client`."""
    app = hook_client.application
    return authed_client_class(make_api_key(sessions, name))(app, app.response_class, True)


def _register(client: FlaskClient, receiver: Receiver) -> str:
    resp = client.post("/v1/webhooks", json={"url": receiver.url})
    assert resp.status_code == 201, resp.get_json()
    return resp.get_json()["id"]


def _done(rec: Receiver, job_id: str, terminal: str = "job.succeeded") -> bool:
    return any((c.payload["type"], c.payload["data"]["id"]) == (terminal, job_id) for c in rec.calls)


def _settled(client: FlaskClient, job_id: str, timeout: float = 20) -> list[dict]:
    deadline = time.monotonic() + timeout
    while True:
        log = deliveries(client, job_id)
        if log and all(d["status"] != "pending" for d in log):
            return log
        assert time.monotonic() < deadline, log
        time.sleep(0.05)


def test_each_tenant_gets_its_own_jobs_signed_with_its_own_secret(
    hook_client, hook_worker, receiver, httpserver, sessions
):
    acme = _tenant(hook_client, sessions, "acme")
    with serve(httpserver, "/acme") as acme_rec, serve(httpserver, "/acme-own") as own_rec:
        ours_ep, acme_ep = _register(hook_client, receiver), _register(acme, acme_rec)
        ours_key, acme_key = secret(hook_client), secret(acme)
        assert ours_key != acme_key and ours_key.startswith("whsec_") and acme_key.startswith("whsec_")
        ours_job = submit(hook_client)
        acme_job = submit(acme, own_rec)  # a job's own webhook is signed with its tenant's secret too
        for rec, job_id in ((receiver, ours_job), (acme_rec, acme_job), (own_rec, acme_job)):
            rec.wait_for(lambda r, j=job_id: _done(r, j))
        _settled(hook_client, ours_job)
        _settled(acme, acme_job)

        assert {c.payload["data"]["id"] for c in receiver.calls} == {ours_job}
        assert {c.payload["data"]["id"] for c in acme_rec.calls} == {acme_job}
        assert [c.payload["type"] for c in own_rec.calls] == ["job.succeeded"]
        for rec, key, other in ((receiver, ours_key, acme_key), (acme_rec, acme_key, ours_key)):
            assert len(rec.calls) == 3  # started, text.completed, succeeded
            for call in rec.calls:
                assert rec.verify(key, call)["type"] == call.payload["type"]
                with pytest.raises(WebhookVerificationError):
                    rec.verify(other, call)
        own_rec.verify(acme_key, own_rec.calls[0])
        with pytest.raises(WebhookVerificationError):
            own_rec.verify(ours_key, own_rec.calls[0])

    with sessions() as s:
        acme_tenant = s.scalar(select(Job.tenant_id).where(Job.id == uuid.UUID(acme_job)))
        sent = s.execute(select(WebhookDelivery.job_id, WebhookDelivery.endpoint_id)).all()
        own = s.scalars(select(WebhookEndpoint).where(WebhookEndpoint.job_id == uuid.UUID(acme_job))).one()
    assert acme_tenant != DEFAULT_TENANT_ID and own.tenant_id == acme_tenant
    # No delivery of one tenant's job to the other tenant's endpoint was even queued.
    assert {(str(j), str(e)) for j, e in sent} == {
        (ours_job, ours_ep),
        (acme_job, acme_ep),
        (acme_job, str(own.id)),
    }


def test_another_tenants_endpoints_and_deliveries_do_not_exist(hook_client, hook_worker, receiver, sessions):
    acme = _tenant(hook_client, sessions, "acme")
    ours_ep = _register(hook_client, receiver)
    assert acme.get("/v1/webhooks").get_json()["data"] == []
    assert acme.delete(f"/v1/webhooks/{ours_ep}").status_code == 404
    assert [e["id"] for e in hook_client.get("/v1/webhooks").get_json()["data"]] == [ours_ep]

    job_id = submit(hook_client)
    receiver.wait_for(lambda r: _done(r, job_id))
    [first, *_] = _settled(hook_client, job_id)
    calls = len(receiver.calls)
    assert acme.get(f"/v1/jobs/{job_id}/webhook-deliveries").status_code == 404
    resp = acme.post(f"/v1/webhook-deliveries/{first['id']}/redeliver")
    assert resp.status_code == 404 and resp.mimetype == "application/problem+json"
    time.sleep(0.3)
    assert len(receiver.calls) == calls, "a refused replay sends nothing"
    assert deliveries(hook_client, job_id)[0]["attempts"] == first["attempts"]
    # The owner can replay it: the 404 above is about ownership, not the delivery.
    assert hook_client.post(f"/v1/webhook-deliveries/{first['id']}/redeliver").status_code == 202
    receiver.wait_for(lambda r: len(r.calls) == calls + 1)

    # Our endpoint does not make acme's jobs write webhook messages at all.
    acme_job = submit(acme)
    wait_finished(acme, acme_job)
    with sessions() as s:
        written = s.scalars(select(WebhookMessage).where(WebhookMessage.job_id == uuid.UUID(acme_job)))
        assert written.all() == []


def test_rotation_is_per_tenant(hook_client, hook_worker, receiver, httpserver, sessions):
    acme = _tenant(hook_client, sessions, "acme")
    ours_key, acme_old = secret(hook_client), secret(acme)
    rotated = acme.post("/v1/webhooks/secret/rotate").get_json()
    acme_new = rotated["secret"]
    assert acme_new not in (acme_old, ours_key) and rotated["previous_secret_active"]
    ours = hook_client.get("/v1/webhooks/secret").get_json()
    assert ours["secret"] == ours_key and not ours["previous_secret_active"]

    with serve(httpserver, "/acme") as acme_rec:
        submit(hook_client, receiver)
        submit(acme, acme_rec)
        receiver.wait_for(lambda r: len(r.calls) == 1)
        acme_rec.wait_for(lambda r: len(r.calls) == 1)
        ours_call, acme_call = receiver.calls[0], acme_rec.calls[0]
        assert len(ours_call.headers["Webhook-Signature"].split(" ")) == 1, "our secret was not rotated"
        receiver.verify(ours_key, ours_call)
        assert len(acme_call.headers["Webhook-Signature"].split(" ")) == 2
        acme_rec.verify(acme_new, acme_call)
        acme_rec.verify(acme_old, acme_call)  # acme's grace period
        with pytest.raises(WebhookVerificationError):
            acme_rec.verify(ours_key, acme_call)
        for wrong in (acme_old, acme_new):
            with pytest.raises(WebhookVerificationError):
                receiver.verify(wrong, ours_call)


def test_migration_moves_existing_webhooks_to_their_tenants(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'gq.db'}"
    before = ScriptDirectory.from_config(alembic_config(url)).get_revision("0006").down_revision
    assert isinstance(before, str)
    upgrade(url, before)
    acme, job, own, registered, acme_ep = (uuid.uuid4() for _ in range(5))
    engine = sa.create_engine(url)

    def run(sql: str, **params: object) -> list[tuple]:
        values = {k: v.hex if isinstance(v, uuid.UUID) else v for k, v in params.items()}  # SQLite: hex
        with engine.begin() as conn:
            result = conn.execute(sa.text(sql), values)
            return [tuple(r) for r in result] if result.returns_rows else []

    run(
        "INSERT INTO tenants (id, name, plan, created_at) VALUES (:id, 'acme', '{}', CURRENT_TIMESTAMP)",
        id=acme,
    )
    run(
        "INSERT INTO jobs (id, tenant_id, status, modality, prompt, params, priority, progress, metadata,"
        " attempts, created_at, updated_at) VALUES (:id, :t, 'queued', 'text', 'p', '{}', 'normal', 0, '{}',"
        " 0, CURRENT_TIMESTAMP, CURRENT_TIMESTAMP)",
        id=job,
        t=acme,
    )
    endpoint = (
        "INSERT INTO webhook_endpoints (id, job_id, url, created_at)"
        " VALUES (:id, :job, 'https://x/', CURRENT_TIMESTAMP)"
    )
    run(endpoint, id=own, job=job)
    run(endpoint, id=registered, job=None)
    run(
        "INSERT INTO webhook_secrets (generation, secret, created_at)"
        " VALUES (1, 'whsec_x', CURRENT_TIMESTAMP)"
    )

    upgrade(url, "0006")
    eps = {uuid.UUID(k): uuid.UUID(v) for k, v in run("SELECT id, tenant_id FROM webhook_endpoints")}
    assert eps == {own: acme, registered: DEFAULT_TENANT_ID}  # a job's own endpoint follows its job
    assert run("SELECT tenant_id, generation FROM webhook_secrets") == [(DEFAULT_TENANT_ID.hex, 1)]

    # Down again: acme's secret goes (generations are deployment-wide there) and its registered
    # endpoint stops, since it would otherwise receive every tenant's events.
    run(
        "INSERT INTO webhook_secrets (tenant_id, generation, secret, created_at)"
        " VALUES (:t, 1, 'whsec_y', CURRENT_TIMESTAMP)",
        t=acme,
    )
    run(
        "INSERT INTO webhook_endpoints (id, tenant_id, url, created_at)"
        " VALUES (:id, :t, 'https://y/', CURRENT_TIMESTAMP)",
        id=acme_ep,
        t=acme,
    )
    downgrade(url, before)
    assert run("SELECT secret FROM webhook_secrets") == [("whsec_x",)]
    stopped = dict(run("SELECT id, disabled_reason FROM webhook_endpoints"))
    assert stopped == {own.hex: None, registered.hex: None, acme_ep.hex: "deleted"}
    upgrade(url, "0006")
    engine.dispose()
