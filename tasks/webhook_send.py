"""One webhook attempt: Standard Webhooks signing, a POST to a checked, pinned address, the retry policy."""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import TypedDict, Unpack
from urllib.parse import urlsplit, urlunsplit

import httpx
from standardwebhooks import Webhook

from models import ssrf
from models.settings import Settings

USER_AGENT = "Genqueue-Webhooks/1"
EXCERPT_CHARS = 512
RETRY_AFTER_MAX_S = 24 * 3600


class Verdict(StrEnum):
    DELIVERED = "delivered"  # 2xx
    RETRY = "retry"  # 408, 429, 5xx, timeouts, connection and DNS errors
    GONE = "gone"  # 410: the receiver asks us to stop
    FAILED = "failed"  # anything else (3xx, other 4xx, a blocked address): retrying will not help
    WITHDRAWN = "withdrawn"  # not sent: the endpoint was disabled (or the delivery dropped) meanwhile


@dataclass(frozen=True)
class Outcome:
    verdict: Verdict
    duration_ms: int
    status_code: int | None = None
    error: str | None = None
    excerpt: str | None = None
    retry_after_s: float | None = None


class _Details(TypedDict, total=False):
    """Outcome's optional fields, as send() passes them."""

    status_code: int | None
    error: str | None
    excerpt: str | None
    retry_after_s: float | None


def signed_headers(secrets: list[str], msg_id: str, body: str, now: float | None = None) -> dict[str, str]:
    """webhook-id/-timestamp/-signature; during a rotation every listed secret signs (space-separated)."""
    stamp = math.floor(time.time() if now is None else now)
    when = datetime.fromtimestamp(stamp, UTC)
    return {
        "webhook-id": msg_id,
        "webhook-timestamp": str(stamp),
        "webhook-signature": " ".join(Webhook(s).sign(msg_id, when, body) for s in secrets),
    }


def make_client(settings: Settings) -> httpx.Client:
    # trust_env=False: an HTTP(S)_PROXY from the environment would bypass the address pinning.
    return httpx.Client(
        timeout=httpx.Timeout(settings.webhook_timeout_s),
        follow_redirects=False,
        trust_env=False,
        headers={"user-agent": USER_AGENT},
    )


def _verdict(code: int) -> Verdict:
    if 200 <= code < 300:
        return Verdict.DELIVERED
    if code == 410:
        return Verdict.GONE
    if code in (408, 429) or code >= 500:
        return Verdict.RETRY
    return Verdict.FAILED


def retry_after_seconds(value: str | None, now: datetime | None = None) -> float | None:
    """Retry-After as seconds from now: delta-seconds or an HTTP-date; None when absent or unparsable."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - (now or datetime.now(UTC))).total_seconds())


def next_delay(schedule: list[float], step: int, retry_after_s: float | None) -> float | None:
    """Seconds until retry number `step + 1`, or None when the schedule is used up.

    Jitter (+-20%) spreads retries of many deliveries that failed together; Retry-After
    can push a retry later, never earlier, by up to a day.
    """
    if step >= len(schedule):
        return None
    delay = schedule[step] * random.uniform(0.8, 1.2)
    if retry_after_s is not None:
        delay = max(delay, min(retry_after_s, RETRY_AFTER_MAX_S))
    return delay


def _pinned(url: str, ip: ssrf.IPAddress, port: int) -> str:
    parts = urlsplit(url)
    host = f"[{ip}]" if ip.version == 6 else str(ip)
    return urlunsplit((parts.scheme, f"{host}:{port}", parts.path or "/", parts.query, ""))


def _read_capped(resp: httpx.Response, cap: int) -> bytes:
    got = bytearray()
    for chunk in resp.iter_bytes():
        got += chunk[: cap - len(got)]
        if len(got) >= cap:
            break  # the rest is never read: closing the stream drops the connection
    return bytes(got)


def post(
    client: httpx.Client,
    settings: Settings,
    url: str,
    body: str,
    headers: dict[str, str],
    still_wanted: Callable[[], bool] = lambda: True,
) -> Outcome:
    """POST `body` to `url`, connecting only to addresses the SSRF guard allows (checked now).

    `still_wanted` is asked right before each connection, after the DNS lookup (which may
    take seconds): a delivery whose endpoint was disabled meanwhile is withdrawn, not sent.
    """
    started = time.monotonic()

    def done(verdict: Verdict, **kw: Unpack[_Details]) -> Outcome:
        return Outcome(verdict, int((time.monotonic() - started) * 1000), **kw)

    try:
        scheme, host, port = ssrf.split_url(url)
        addresses = ssrf.check_url(url, allow_private=settings.webhook_allow_private)
    except ssrf.Unresolvable as exc:
        return done(Verdict.RETRY, error=f"dns: {exc}")
    except ssrf.UnsafeURL as exc:
        return done(Verdict.FAILED, error=f"blocked: url {exc}")
    parts = urlsplit(url)
    request_headers = {**headers, "content-type": "application/json", "host": parts.netloc}
    # https: TLS is verified against the real host name, sent as SNI, though we dial the address.
    extensions = {"sni_hostname": host} if scheme == "https" else {}
    error = "no address to connect to"
    for ip in addresses:
        if not still_wanted():
            return done(Verdict.WITHDRAWN, error="withdrawn before sending: endpoint disabled")
        try:
            with client.stream(
                "POST",
                _pinned(url, ip, port),
                content=body.encode(),
                headers=request_headers,
                extensions=extensions,
            ) as resp:
                raw = _read_capped(resp, settings.webhook_max_response_bytes)
                return done(
                    _verdict(resp.status_code),
                    status_code=resp.status_code,
                    excerpt=raw.decode(errors="replace")[:EXCERPT_CHARS] or None,
                    retry_after_s=retry_after_seconds(resp.headers.get("retry-after")),
                )
        except httpx.ConnectError as exc:
            error = f"connect: {exc or type(exc).__name__}"
            continue  # the next address of the host may answer
        except httpx.TimeoutException as exc:
            return done(Verdict.RETRY, error=f"timeout: {type(exc).__name__}")
        except httpx.HTTPError as exc:
            return done(Verdict.RETRY, error=f"{type(exc).__name__}: {exc}")
    return done(Verdict.RETRY, error=error)
