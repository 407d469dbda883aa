"""Webhooks of jobs submitted in a batch (POST /v1/jobs/batch): each job's own, as if submitted alone."""

from __future__ import annotations

from tests.support.api import wait_finished
from tests.webhooks.helpers import deliveries, secret


def test_each_job_of_a_batch_sends_its_own_webhook(hook_client, hook_worker, receiver):
    hook = {"url": receiver.url}
    jobs = [
        {"prompt": "fox 0", "modality": "text", "webhook": hook},
        {"prompt": "fox 1", "modality": "text"},  # no webhook: nothing is sent for it
        {
            "prompt": "fox 2",
            "modality": "text",
            "webhook": hook | {"events": ["job.started", "job.succeeded"]},
        },
    ]
    resp = hook_client.post("/v1/jobs/batch", json={"jobs": jobs})
    assert resp.status_code == 202, resp.get_json()
    ids = [j["id"] for j in resp.get_json()["jobs"]]
    finished = [wait_finished(hook_client, jid) for jid in ids]
    receiver.wait_for(lambda r: len(r.calls) == 3)
    key = secret(hook_client)
    got = sorted((p["data"]["id"], p["type"]) for p in (receiver.verify(key, c) for c in receiver.calls))
    assert got == sorted([(ids[0], "job.succeeded"), (ids[2], "job.started"), (ids[2], "job.succeeded")])
    terminal = [receiver.verify(key, c) for c in receiver.calls if c.payload["type"] == "job.succeeded"]
    assert {p["data"]["id"]: p["data"] for p in terminal}[ids[0]] == finished[0]  # GET's resource
    assert deliveries(hook_client, ids[1]) == []
