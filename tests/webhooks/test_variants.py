"""A video job's `job.variant.completed` webhooks: one per output variant, after job.succeeded."""

from __future__ import annotations

from tests.support.api import wait_finished
from tests.support.procs import wait_for
from tests.webhooks.helpers import secret, submit

PARAMS = {"width": 64, "height": 64, "num_frames": 5, "steps": 2, "variants": ["webm", "preview"]}


def test_each_variant_is_a_signed_webhook_naming_it(hook_client, hook_worker, receiver):
    job_id = submit(
        hook_client, receiver, events=["job.succeeded", "job.variant.completed"],
        prompt="a lantern on a pier", modality="video", params=PARAMS,
    )  # fmt: skip
    assert wait_finished(hook_client, job_id, timeout=90)["status"] == "succeeded"
    receiver.wait_for(lambda r: len(r.calls) == 3)
    payloads = [receiver.verify(secret(hook_client), call) for call in receiver.calls]
    assert sorted(p["type"] for p in payloads) == ["job.succeeded"] + ["job.variant.completed"] * 2
    made = sorted(
        (p for p in payloads if p["type"] == "job.variant.completed"), key=lambda p: p["variant"]["name"]
    )
    assert [p["variant"] for p in made] == [
        {"name": "preview", "status": "ready", "variants_pending": 0},
        {"name": "webm", "status": "ready", "variants_pending": 1},
    ]
    # Each payload's job resource as that event left it: the variant named is ready, with its link.
    for p in made:
        slot = p["data"]["variants"][p["variant"]["name"]]
        assert slot["status"] == "ready" and slot["url"].endswith(f"variant={p['variant']['name']}")
    [succeeded] = [p for p in payloads if p["type"] == "job.succeeded"]
    assert "variant" not in succeeded
    assert set(succeeded["data"]["variants"]) == {"webm", "preview"}
    final = wait_for(lambda: hook_client.get(f"/v1/jobs/{job_id}").get_json(), 10)
    assert {v["status"] for v in final["variants"].values()} == {"ready"}
