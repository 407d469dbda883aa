"""The SSRF guard: refused at submission (422 naming the field) and again at delivery (DNS rebinding)."""

from __future__ import annotations

import ipaddress
import socket
import time
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import func, select

from models import Job, ssrf
from models.webhook import WebhookEndpoint
from tests.webhooks.helpers import deliveries, submit, wait_job

REFUSED = [
    "http://127.0.0.1/hook",
    "http://10.0.0.1/hook",
    "http://169.254.169.254/latest/meta-data/",
    "http://[::1]:8080/hook",
    "http://localhost/hook",  # a host name that resolves to 127.0.0.1
    "http://[::ffff:127.0.0.1]/hook",
    "http://100.100.100.200/",
    "http://[fd00:ec2::254]/",
    "http://224.0.0.1/",
    "http://0.0.0.0/",
]


@pytest.mark.parametrize("url", REFUSED)
def test_guard_refuses_internal_addresses(url: str) -> None:
    with pytest.raises(ssrf.UnsafeURL, match="must not point at"):
        ssrf.check_url(url)
    ssrf.check_url(url, allow_private=True)  # the development switch lets them through


@pytest.mark.parametrize(
    ("url", "message"),
    [
        ("ftp://example.com/x", "http or https"),
        ("file:///etc/passwd", "http or https"),
        ("http://user:pw@93.184.216.34/", "credentials"),
        ("http:///nohost", "must name a host"),
        ("http://93.184.216.34:99999/", "not a valid URL"),
    ],
)
def test_guard_refuses_malformed_urls(url: str, message: str) -> None:
    with pytest.raises(ssrf.UnsafeURL, match=message):
        ssrf.check_url(url, allow_private=True)


def test_public_address_passes() -> None:
    assert ssrf.check_url("https://93.184.216.34/hook") == [ipaddress.ip_address("93.184.216.34")]


def fake_dns(monkeypatch, answers: dict[str, Callable[[], str]]) -> None:
    """Resolve the given names to what their callables return; everything else as usual."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if host in answers:
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (answers[host](), port))]
        return real(host, port, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize("url", [*REFUSED[:5], "http://evil.example/hook"])
def test_submission_refuses_internal_targets_with_422_naming_the_field(client, sessions, monkeypatch, url):
    fake_dns(monkeypatch, {"evil.example": lambda: "127.0.0.1"})
    resp = client.post("/v1/jobs", json={"prompt": "p", "modality": "text", "webhook": {"url": url}})
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    [err] = resp.get_json()["errors"]
    assert err["field"] == "webhook.url" and "must not point at" in err["message"]
    resp = client.post("/v1/webhooks", json={"url": url})
    assert resp.status_code == 422 and resp.get_json()["errors"][0]["field"] == "url"
    with sessions() as s:
        assert s.scalar(select(func.count()).select_from(Job)) == 0
        assert s.scalar(select(func.count()).select_from(WebhookEndpoint)) == 0


def test_submission_rejects_bad_webhook_shapes(client):
    def errors(webhook: Any) -> list[dict[str, str]]:
        resp = client.post("/v1/jobs", json={"prompt": "p", "modality": "text", "webhook": webhook})
        assert resp.status_code == 422
        return resp.get_json()["errors"]

    public = "https://93.184.216.34/"
    assert errors({"url": "ftp://x.example/"})[0]["field"] == "webhook.url"
    assert errors({"url": public, "events": ["job.exploded"]})[0]["field"] == "webhook.events.0"
    assert errors({"url": public, "secret": "x"})[0]["field"] == "webhook.secret"
    assert errors({"events": ["job.failed"]})[0]["field"] == "webhook.url"


@pytest.mark.parametrize("overrides", [{"webhook_allow_private": False}])
def test_delivery_checks_again_and_refuses_a_rebound_name(hook_client, hook_worker, receiver, monkeypatch):
    # Public when the job is submitted, loopback when the webhook goes out: DNS rebinding.
    lookups: list[str] = []

    def answer() -> str:
        lookups.append("x")
        return "93.184.216.34" if len(lookups) == 1 else "127.0.0.1"

    fake_dns(monkeypatch, {"rebind.example": answer})
    port = receiver.url.split(":")[2].split("/")[0]
    job_id = submit(hook_client, url=f"http://rebind.example:{port}/hook")
    wait_job(hook_client, job_id)
    deadline = time.monotonic() + 15
    while not (log := deliveries(hook_client, job_id)) or log[0]["status"] == "pending":
        assert time.monotonic() < deadline, log
        time.sleep(0.05)
    assert log[0]["status"] == "failed" and log[0]["attempts"] == 1, "blocked, and not retried"
    assert "must not point at a loopback address" in log[0]["last_error"]
    assert receiver.calls == []


@pytest.mark.parametrize("overrides", [{"webhook_allow_private": True}])
def test_delivery_connects_to_the_checked_address(hook_client, hook_worker, receiver, monkeypatch):
    # The name resolves only through the guard's lookup; the request dials that address and
    # keeps the name in Host, so no second lookup can send it elsewhere.
    fake_dns(monkeypatch, {"hooks.example.test": lambda: "127.0.0.1"})
    port = receiver.url.split(":")[2].split("/")[0]
    submit(hook_client, url=f"http://hooks.example.test:{port}/hook")
    receiver.wait_for(lambda r: len(r.calls) == 1)
    assert receiver.calls[0].headers["Host"] == f"hooks.example.test:{port}"
