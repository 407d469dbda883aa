"""The webhook metrics a worker records: requests by outcome, retries used up (the worker's own registry)."""

from __future__ import annotations

import pytest
from werkzeug import Response

from tests.support.api import wait_finished
from tests.support.workers import metric
from tests.webhooks.helpers import submit
from tests.webhooks.test_delivery import wait_settled

OUTCOMES = ("delivered", "retry", "exhausted")


def attempts() -> dict[str, float]:
    """genqueue_webhook_attempts_total by outcome, as the in-process worker counted them."""
    return {o: metric("genqueue_webhook_attempts_total", outcome=o) for o in OUTCOMES}


@pytest.mark.parametrize("overrides", [{"webhook_retry_schedule_s": [0.05]}])
def test_webhook_requests_are_counted_by_outcome(hook_client, hook_worker, receiver, sessions) -> None:
    before = attempts()
    receiver.reply = lambda n, p: Response(status=503 if n <= 1 else 200)
    delivered = submit(hook_client, receiver)
    receiver.wait_for(lambda r: len(r.delivered()) == 1)
    wait_settled(sessions, wait_finished(hook_client, delivered)["id"])
    receiver.reply = lambda n, p: Response(status=500)
    given_up = submit(hook_client, receiver)
    receiver.wait_for(lambda r: len(r.calls) == 4)
    wait_settled(sessions, wait_finished(hook_client, given_up)["id"])
    after = attempts()
    got = {o: after[o] - before[o] for o in OUTCOMES}
    # 503 then 200; then 500 retried once (the one-step schedule) and given up.
    assert got == {"delivered": 1, "retry": 2, "exhausted": 1}
