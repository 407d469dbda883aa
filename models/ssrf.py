"""SSRF guard for webhook URLs: http(s) only, and every address the host resolves to must be public."""

from __future__ import annotations

import functools
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from urllib.parse import urlsplit

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
RESOLVE_TIMEOUT_S = 3.0
MAX_URL_CHARS = 2048

# Cloud metadata services that is_global alone would not catch on every Python version.
_METADATA = (
    ipaddress.ip_network("169.254.0.0/16"),  # AWS, GCP, Azure, OpenStack (169.254.169.254)
    ipaddress.ip_network("100.100.100.200/32"),  # Alibaba Cloud
    ipaddress.ip_network("fd00:ec2::/32"),  # AWS IPv6 (fd00:ec2::254)
)


@functools.cache
def _resolver() -> ThreadPoolExecutor:
    # getaddrinfo has no timeout of its own: run it where we can stop waiting.
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="ssrf-dns")


class UnsafeURL(ValueError):
    """The URL is not an allowed webhook target; the message says why (fit for API clients)."""


class Unresolvable(UnsafeURL):
    """The host did not resolve: maybe a passing DNS failure, so delivery retries it."""


def blocked_reason(ip: IPAddress) -> str | None:
    """Why a connection to `ip` is refused, or None when it is a public unicast address."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped  # ::ffff:127.0.0.1 is 127.0.0.1
    if any(ip in net for net in _METADATA):
        return "a cloud metadata or link-local address"
    if ip.is_loopback:
        return "a loopback address"
    if ip.is_link_local:
        return "a link-local address"
    if ip.is_multicast:
        return "a multicast address"
    if ip.is_private or ip.is_unspecified or ip.is_reserved or not ip.is_global:
        return "a private or reserved address"
    return None


def split_url(url: str) -> tuple[str, str, int]:
    """(scheme, host, port) of an absolute http(s) URL; raises UnsafeURL for anything else."""
    if len(url) > MAX_URL_CHARS:
        raise UnsafeURL(f"must be at most {MAX_URL_CHARS} characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise UnsafeURL(f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise UnsafeURL("must be an http or https URL")
    if not parts.hostname:
        raise UnsafeURL("must name a host")
    if parts.username is not None or parts.password is not None:
        raise UnsafeURL("must not contain credentials")
    return parts.scheme, parts.hostname, port or (443 if parts.scheme == "https" else 80)


def resolve(host: str, port: int, timeout_s: float = RESOLVE_TIMEOUT_S) -> list[IPAddress]:
    """Every address of `host` (an IP literal resolves to itself), in resolver order, bounded in time."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    future = _resolver().submit(socket.getaddrinfo, host, port, 0, socket.SOCK_STREAM)
    try:
        infos = future.result(timeout=timeout_s)
    except FutureTimeout:
        raise Unresolvable(f"host {host!r} did not resolve within {timeout_s:g} s") from None
    except OSError as exc:
        raise Unresolvable(f"host {host!r} does not resolve ({exc.strerror or exc})") from None
    out: list[IPAddress] = []
    for info in infos:
        ip = ipaddress.ip_address(str(info[4][0]).split("%", 1)[0])  # drop an IPv6 zone id
        if ip not in out:
            out.append(ip)
    return out


def _is_literal(host: str) -> bool:
    try:
        ipaddress.ip_address(host)
    except ValueError:
        return False
    return True


def check_url(url: str, *, allow_private: bool = False) -> list[IPAddress]:
    """Validate `url` and resolve it; every address must be public unless `allow_private`.

    Returns the addresses to connect to: callers connect to these, not to the name, so a
    second lookup cannot swap in a private address (DNS rebinding).
    """
    _, host, port = split_url(url)
    addresses = resolve(host, port)
    if not addresses:
        raise Unresolvable(f"host {host!r} has no addresses")
    if not allow_private:
        for ip in addresses:
            reason = blocked_reason(ip)
            if reason:
                where = str(ip) if _is_literal(host) else f"{host} resolves to {ip}"
                raise UnsafeURL(f"must not point at {reason} ({where})")
    return addresses
