"""A storyboard's `job.shot.completed` webhooks: one per shot, each saying which shot it is about."""

from __future__ import annotations

from tests.support.api import wait_finished
from tests.webhooks.helpers import secret, submit

PARAMS = {"width": 64, "height": 64, "num_frames": 5, "fps": 6, "steps": 2, "seed": 3, "shots": 3}
PROMPT = "A train leaves the station. It crosses a bridge. It arrives at the sea."


def test_each_shot_completion_is_a_signed_webhook_naming_the_shot(hook_client, hook_worker, receiver):
    job_id = submit(
        hook_client, receiver, events=["job.shot.completed", "job.succeeded"],
        prompt=PROMPT, modality="storyboard", params=PARAMS | {"enhance_prompt": False},
    )  # fmt: skip
    job = wait_finished(hook_client, job_id, timeout=90)
    assert job["status"] == "succeeded", job["error"]
    receiver.wait_for(lambda r: len(r.calls) == 4)
    payloads = [receiver.verify(secret(hook_client), call) for call in receiver.calls]
    shots = [p for p in payloads if p["type"] == "job.shot.completed"]
    assert sorted(p["shot"]["index"] for p in shots) == [0, 1, 2]
    assert sorted(p["shot"]["shots_completed"] for p in shots) == [1, 2, 3]
    assert all(p["shot"]["shots"] == 3 and p["shot"]["cached"] is False for p in shots)
    for p in shots:
        assert p["data"]["id"] == job_id and p["data"]["modality"] == "storyboard"
        index = p["shot"]["index"]
        assert p["shot"]["video_url"].endswith(f"/v1/jobs/{job_id}/content?variant=shot&index={index}")
        assert p["shot"]["video_url"] == job["storyboard"]["shots"][index]["video_url"]
    [last] = [p for p in payloads if p["type"] == "job.succeeded"]
    assert "shot" not in last
    # The job as GET returned it, less the shot list (webhook payloads leave it null).
    assert last["data"] == job | {"storyboard": job["storyboard"] | {"shots": None}}
