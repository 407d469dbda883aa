"""The SSRF guard: refused at submission (422 naming the field) and again at delivery (DNS rebinding)."""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import pytest
from pytest_httpserver import HTTPServer
from sqlalchemy import func, select

from models import Job, ssrf
from models.webhook import WebhookEndpoint
from tests.support.api import wait_finished
from tests.support.procs import wait_for
from tests.webhooks.helpers import deliveries, submit

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


# Every IPv6 form that embeds or translates an IPv4 address, carrying one it must not reach:
# (address, the form and IPv4 the refusal names, the reason).
TRANSITION = [
    ("::ffff:127.0.0.1", "IPv4-mapped for 127.0.0.1", "a loopback address"),
    ("::ffff:10.0.0.1", "IPv4-mapped for 10.0.0.1", "a private or reserved address"),
    ("::127.0.0.1", "IPv4-compatible for 127.0.0.1", "a loopback address"),
    ("::169.254.169.254", "IPv4-compatible for 169.254.169.254", "a cloud metadata or link-local address"),
    ("2002:7f00:1::", "6to4 for 127.0.0.1", "a loopback address"),  # the finding's address
    ("2002:c0a8:101::1", "6to4 for 192.168.1.1", "a private or reserved address"),
    ("2002:a9fe:a9fe::", "6to4 for 169.254.169.254", "a cloud metadata or link-local address"),
    ("64:ff9b::127.0.0.1", "NAT64 for 127.0.0.1", "a loopback address"),
    ("64:ff9b::10.1.2.3", "NAT64 for 10.1.2.3", "a private or reserved address"),
    ("64:ff9b:1::127.0.0.1", "local-use NAT64 for 127.0.0.1", "a loopback address"),
    # Teredo: server 65.54.227.120 (public), client 127.0.0.1 stored inverted in the last 32 bits.
    ("2001:0:4136:e378:8000:63bf:80ff:fffe", "Teredo client for 127.0.0.1", "a loopback address"),
    ("2001:0:4136:e378::f5ff:fffe", "Teredo client for 10.0.0.1", "a private or reserved address"),
    # Teredo: server 127.0.0.1, client 93.184.210.34 (public).
    ("2001:0:7f00:1::a247:2ddd", "Teredo server for 127.0.0.1", "a loopback address"),
]
# The same forms carrying a public IPv4 address: judged by it, so allowed (DNS64 networks
# hand out 64:ff9b:: addresses for every IPv4-only host).
TRANSITION_PUBLIC = [
    "::ffff:93.184.216.34",
    "::93.184.216.34",
    "2002:5db8:d822::1",
    "64:ff9b::93.184.216.34",
    "2001:0:4136:e378:8000:63bf:a247:2ddd",  # server 65.54.227.120, client 93.184.210.34
]


@pytest.mark.parametrize(("address", "carries", "reason"), TRANSITION)
def test_guard_judges_ipv6_transition_forms_by_the_ipv4_inside(
    address: str, carries: str, reason: str
) -> None:
    with pytest.raises(ssrf.UnsafeURL) as err:
        ssrf.check_url(f"http://[{address}]:8080/h")
    assert str(err.value).startswith(f"must not point at {reason} (")
    assert str(err.value).endswith(f", {carries})")


@pytest.mark.parametrize("address", TRANSITION_PUBLIC)
def test_transition_forms_of_a_public_ipv4_pass(address: str) -> None:
    assert ssrf.check_url(f"http://[{address}]/h") == [ipaddress.ip_address(address)]


def test_local_use_nat64_is_refused_whatever_it_carries() -> None:
    # One network's own prefix, with the IPv4 address wherever its operator put it.
    with pytest.raises(ssrf.UnsafeURL, match="must not point at a local-use NAT64 address"):
        ssrf.check_url("http://[64:ff9b:1::93.184.216.34]/h")


def fake_dns(monkeypatch, answers: dict[str, Callable[[], str]]) -> None:
    """Resolve the given names to what their callables return (A or AAAA); everything else as usual."""
    real = socket.getaddrinfo

    def getaddrinfo(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if host in answers:
            address = answers[host]()
            if ":" in address:
                return [(socket.AF_INET6, socket.SOCK_STREAM, 6, "", (address, port, 0, 0))]
            return [(socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, port))]
        return real(host, port, *args, **kw)

    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


@pytest.mark.parametrize(
    ("url", "says"),
    [
        *((url, "must not point at") for url in REFUSED[:5]),
        ("http://evil.example/hook", "evil.example resolves to 127.0.0.1"),
        # The same judgement as delivery's: every transition form, as a literal and behind a name.
        *(
            (f"http://[{a}]:8080/h", f"{reason} ({ipaddress.ip_address(a)}, {c})")
            for a, c, reason in TRANSITION
        ),
        ("http://evil6.example/hook", "evil6.example resolves to 2002:7f00:1::, 6to4 for 127.0.0.1"),
    ],
)
def test_submission_refuses_internal_targets_with_422_naming_the_field(
    client, sessions, monkeypatch, url, says
):
    fake_dns(monkeypatch, {"evil.example": lambda: "127.0.0.1", "evil6.example": lambda: "2002:7f00:1::"})
    resp = client.post("/v1/jobs", json={"prompt": "p", "modality": "text", "webhook": {"url": url}})
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    [err] = resp.get_json()["errors"]
    assert err["field"] == "webhook.url" and "must not point at" in err["message"] and says in err["message"]
    resp = client.post("/v1/webhooks", json={"url": url})
    assert resp.status_code == 422 and resp.mimetype == "application/problem+json"
    [err] = resp.get_json()["errors"]
    assert err["field"] == "url" and says in err["message"]
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
@pytest.mark.parametrize(
    ("rebound", "says"),
    [
        ("127.0.0.1", "a loopback address (rebind.example resolves to 127.0.0.1)"),
        # Every transition form, rebound at delivery: the delivery's judgement is the submission's.
        *(
            (a, f"{reason} (rebind.example resolves to {ipaddress.ip_address(a)}, {c})")
            for a, c, reason in TRANSITION
        ),
    ],
)
def test_delivery_checks_again_and_refuses_a_rebound_name(
    hook_client, hook_worker, receiver, monkeypatch, rebound, says
):
    # Public when the job is submitted, internal when the webhook goes out: DNS rebinding.
    lookups: list[str] = []

    def answer() -> str:
        lookups.append("x")
        return "93.184.216.34" if len(lookups) == 1 else rebound

    fake_dns(monkeypatch, {"rebind.example": answer})
    port = receiver.url.split(":")[2].split("/")[0]
    job_id = submit(hook_client, url=f"http://rebind.example:{port}/hook")
    wait_finished(hook_client, job_id)
    deadline = time.monotonic() + 15
    while not (log := deliveries(hook_client, job_id)) or log[0]["status"] == "pending":
        assert time.monotonic() < deadline, log
        time.sleep(0.05)
    assert log[0]["status"] == "failed" and log[0]["attempts"] == 1, "blocked, and not retried"
    assert log[0]["last_error"] == f"blocked: url must not point at {says}"
    assert receiver.calls == []


@pytest.mark.parametrize("overrides", [{"webhook_allow_private": True}])
def test_delivery_connects_to_the_checked_address(hook_client, receiver, monkeypatch, request):
    # At delivery the guard's lookup answers the receiver's address (127.0.0.1) and any later
    # lookup answers 127.0.0.2, where a decoy listens on the same port. A client that dialled
    # the name (resolving a second time) would reach the decoy; a pinned one reaches the
    # receiver, with the name kept in Host.
    port = urlsplit(receiver.url).port
    assert port is not None
    decoy = HTTPServer(host="127.0.0.2", port=port)
    decoy.expect_request("/hook", method="POST").respond_with_data("decoy")
    decoy.start()
    request.addfinalizer(decoy.stop)
    delivering = threading.Event()
    lookups: list[str] = []

    def answer() -> str:
        if not delivering.is_set():
            return "127.0.0.1"  # the submission's check
        lookups.append("127.0.0.1" if not lookups else "127.0.0.2")
        return lookups[-1]

    fake_dns(monkeypatch, {"hooks.example.test": answer})
    submit(hook_client, url=f"http://hooks.example.test:{port}/hook")
    delivering.set()
    request.getfixturevalue("hook_worker")  # started only now: every lookup from here is delivery's
    wait_for(lambda: receiver.calls or decoy.log, timeout=30, interval=0.05, what="the webhook")
    assert decoy.log == [], "the client resolved the name again and dialled what it got"
    assert len(receiver.calls) == 1 and receiver.calls[0].headers["Host"] == f"hooks.example.test:{port}"
    assert lookups == ["127.0.0.1"], "one lookup at delivery: the guard's"
