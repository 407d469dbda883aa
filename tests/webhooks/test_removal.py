"""Retention in webhooks: payloads say the plan's expiry; a removed job's messages lose its data."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import select, text, update
from werkzeug import Response

from models import Job
from models.base import utcnow
from models.db import transaction
from models.webhook import WebhookMessage
from tasks import retention as retention_task
from tasks.runtime import Runtime
from tests.support.api import authed_client_class, make_api_key, wait_finished
from tests.webhooks.helpers import deliveries, secret, submit
from tests.webhooks.test_delivery import wait_settled


def _leftovers(sessions: Any, marker: str) -> list[str]:
    """Every stored place of the job's data that still holds `marker` (the prompt's, echoed)."""
    probes = {
        "jobs": "SELECT count(*) FROM jobs WHERE prompt LIKE :m OR output_text LIKE :m",
        "job_events": "SELECT count(*) FROM job_events WHERE CAST(data AS TEXT) LIKE :m",
        "webhook_messages": "SELECT count(*) FROM webhook_messages "
        "WHERE CAST(snapshot AS TEXT) LIKE :m OR body LIKE :m",
        "webhook_attempts": "SELECT count(*) FROM webhook_attempts WHERE response_excerpt LIKE :m",
    }
    with sessions() as s:
        return [table for table, sql in probes.items() if s.scalar(text(sql), {"m": f"%{marker}%"})]


def _remove(how: str, client: Any, hooks: Any, sessions: Any, job_id: str) -> None:
    if how == "delete":
        assert client.delete(f"/v1/jobs/{job_id}").status_code == 204
        return
    with transaction(sessions) as s:  # past its retention, then the retention task's pass
        s.execute(
            update(Job)
            .where(Job.id == uuid.UUID(job_id))
            .values(completed_at=utcnow() - timedelta(seconds=hooks.retention_s + 60))
        )
    rt = Runtime(hooks, sessions.kw["bind"], sessions, os.getpid())
    assert retention_task.expire(rt) == 1


@pytest.mark.parametrize("how", ["delete", "expire"])
def test_removal_scrubs_the_webhook_messages_and_a_redelivery_sends_the_scrubbed_payload(
    how, hook_client, hook_worker, hooks, receiver, sessions
):
    marker = f"wren-{uuid.uuid4().hex[:8]}"
    job_id = submit(hook_client, receiver, prompt=f"a {marker} at dusk")
    assert wait_finished(hook_client, job_id)["status"] == "succeeded"
    receiver.wait_for(lambda r: len(r.delivered()) == 1)
    wait_settled(sessions, job_id)
    sent = receiver.calls[0].payload
    assert marker in sent["data"]["prompt"] and sent["data"]["data_removed"] is False
    assert _leftovers(sessions, marker)  # the prompt is stored: the probes can see it

    _remove(how, hook_client, hooks, sessions, job_id)
    assert _leftovers(sessions, marker) == []
    with sessions() as s:
        messages = s.scalars(
            select(WebhookMessage)
            .where(WebhookMessage.job_id == uuid.UUID(job_id))
            .order_by(WebhookMessage.id)
        ).all()
    assert messages and all(m.body is None for m in messages)
    last = messages[-1].snapshot  # each message keeps the status it reported, its timings too
    assert last["status"] == "succeeded" and last["completed_at"] is not None
    for m in messages:  # the bookkeeping stays: status, timings, the job's own webhook
        assert m.snapshot["prompt"] == "" and m.snapshot["output_text"] is None
        assert m.snapshot["data_removed_at"] is not None and m.snapshot["status"] in ("running", "succeeded")
        assert m.snapshot["webhook"]["url"] == receiver.url

    d = deliveries(hook_client, job_id)[0]
    assert hook_client.post(f"/v1/webhook-deliveries/{d['id']}/redeliver").status_code == 202
    receiver.wait_for(lambda r: len(r.delivered()) == 2)
    again = receiver.verify(secret(hook_client), receiver.calls[-1])  # signed over the new body
    assert receiver.calls[-1].headers["Webhook-Id"] == d["webhook_id"]  # the same message
    assert (again["type"], again["data"]["status"], again["data"]["prompt"]) == (
        "job.succeeded",
        "succeeded",
        "",
    )
    assert again["data"]["data_removed"] is True and again["data"]["outputs"]["text"] is None
    assert again["data"]["timings"] == sent["data"]["timings"]  # accounting is kept
    assert again["data"]["expires_at"] == sent["data"]["expires_at"]
    wait_settled(sessions, job_id)
    assert _leftovers(sessions, marker) == []


def test_a_delivery_pending_when_its_job_is_deleted_goes_out_scrubbed(
    hook_client, hook_worker, receiver, sessions
):
    marker = f"lark-{uuid.uuid4().hex[:8]}"
    holder: dict[str, str] = {}

    def reply(number: int, payload: dict[str, Any]) -> Response:
        if number == 1:  # the job is deleted while its first attempt is in flight; that one fails
            assert hook_client.delete(f"/v1/jobs/{holder['id']}").status_code == 204
            return Response("busy", status=500)
        return Response(status=204)

    receiver.reply = reply
    holder["id"] = job_id = submit(hook_client, receiver, prompt=f"a {marker} singing")
    receiver.wait_for(lambda r: len(r.delivered()) == 1)
    first, retried = receiver.calls[0], receiver.calls[1]
    assert marker in first.payload["data"]["prompt"]  # sent before the deletion
    assert retried.headers["Webhook-Id"] == first.headers["Webhook-Id"]
    assert retried.payload["data"]["prompt"] == "" and retried.payload["data"]["data_removed"] is True
    receiver.verify(secret(hook_client), retried)
    wait_settled(sessions, job_id)
    assert _leftovers(sessions, marker) == []
    [d] = deliveries(hook_client, job_id)
    assert (d["status"], d["attempts"]) == ("delivered", 2)


def test_a_payloads_expires_at_follows_the_tenants_plan(hook_client, hook_worker, receiver, sessions):
    app = hook_client.application
    client = authed_client_class(make_api_key(sessions, "acme-hook-plan", retention_s=600))(
        app, app.response_class, True
    )
    job_id = submit(client, receiver, prompt="a plover")
    done = wait_finished(client, job_id)
    receiver.wait_for(lambda r: len(r.delivered()) == 1)
    data = receiver.calls[0].payload["data"]
    completed = datetime.fromisoformat(done["timings"]["completed_at"].replace("Z", "+00:00"))
    expected = (completed + timedelta(seconds=600)).isoformat().replace("+00:00", "Z")
    assert data["expires_at"] == done["expires_at"] == expected  # as the API says it, from the plan
