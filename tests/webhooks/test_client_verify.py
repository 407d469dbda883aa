"""genqueue_client.verify_webhook on a real delivery: a real worker signs and sends it to a receiver."""

from __future__ import annotations

import json

import pytest

import genqueue_client as gq
from tests.support.api import wait_finished
from tests.webhooks.helpers import secret, submit


def test_the_helper_accepts_a_real_delivery_and_rejects_a_tampered_one(hook_client, hook_worker, receiver):
    job_id = submit(hook_client, receiver)
    job = wait_finished(hook_client, job_id)
    receiver.wait_for(lambda r: len(r.calls) == 1)
    call, key = receiver.calls[0], secret(hook_client)

    event = gq.verify_webhook(key, call.body, call.headers)
    assert (event["type"], event["data"]) == ("job.succeeded", job)
    shouted = {k.upper(): v for k, v in call.headers.items()}  # header names in any case, body as str
    assert gq.verify_webhook(key, call.body.decode(), shouted) == event

    tampered = json.loads(call.body)
    tampered["data"]["status"] = "failed"
    with pytest.raises(gq.InvalidSignature):
        gq.verify_webhook(key, json.dumps(tampered).encode(), call.headers)
    with pytest.raises(gq.InvalidSignature):
        gq.verify_webhook("whsec_" + "A" * 43 + "=", call.body, call.headers)  # another secret
    unsigned = {k: v for k, v in call.headers.items() if k.lower() != "webhook-signature"}
    with pytest.raises(gq.InvalidSignature):
        gq.verify_webhook(key, call.body, unsigned)
