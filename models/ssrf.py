"""SSRF guard for webhook URLs, at submission and at delivery: http(s) only, every resolved address public."""

from __future__ import annotations

import functools
import ipaddress
import socket
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass
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
# IPv6 prefixes that carry an IPv4 address in their last 32 bits (the stdlib has no property
# for these; ipv4_mapped, sixtofour and teredo cover the other forms).
_NAT64 = ipaddress.ip_network("64:ff9b::/96")  # RFC 6052 well-known prefix
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")  # RFC 8215 local-use prefix
_IPV4_COMPATIBLE = ipaddress.ip_network("::/96")  # RFC 4291, deprecated
_LOOPBACK_OR_ANY = ipaddress.ip_network("::/127")  # :: and ::1 are IPv6's own, not IPv4-compatible


@functools.cache
def _resolver() -> ThreadPoolExecutor:
    # getaddrinfo has no timeout of its own: run it where we can stop waiting.
    return ThreadPoolExecutor(max_workers=4, thread_name_prefix="ssrf-dns")


class UnsafeURL(ValueError):
    """The URL is not an allowed webhook target; the message says why (fit for API clients)."""


class Unresolvable(UnsafeURL):
    """The host did not resolve: maybe a passing DNS failure, so delivery retries it."""


@dataclass(frozen=True)
class Refusal:
    """Why an address is refused; `form` and `ipv4` say which embedded IPv4 address decided it."""

    reason: str  # "a loopback address": fits "must not point at ..."
    form: str | None = None  # "6to4", "NAT64", "Teredo client", ...
    ipv4: ipaddress.IPv4Address | None = None

    def where(self, ip: IPAddress) -> str:
        return f"{ip}, {self.form} for {self.ipv4}" if self.form else str(ip)


def carried_ipv4(ip: ipaddress.IPv6Address) -> list[tuple[str, ipaddress.IPv4Address]]:
    """The IPv4 addresses an IPv6 address embeds or translates to, each with its form's name.

    A connection to such an address ends at (or is relayed to) that IPv4 host: a dual-stack
    socket dials ::ffff:127.0.0.1 as 127.0.0.1, a NAT64 gateway forwards 64:ff9b::7f00:1 to
    127.0.0.1, a 6to4 or Teredo relay tunnels to the IPv4 it names.
    """
    if ip.ipv4_mapped is not None:
        return [("IPv4-mapped", ip.ipv4_mapped)]
    if ip.teredo is not None:
        server, client = ip.teredo  # the client is the inverted last 32 bits
        return [("Teredo client", client), ("Teredo server", server)]
    if ip.sixtofour is not None:
        return [("6to4", ip.sixtofour)]
    low32 = ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF)
    if ip in _NAT64:
        return [("NAT64", low32)]
    if ip in _NAT64_LOCAL:
        return [("local-use NAT64", low32)]  # the /96 layout; the operator may pick another
    if ip in _IPV4_COMPATIBLE and ip not in _LOOPBACK_OR_ANY:
        return [("IPv4-compatible", low32)]
    return []


def _plain_reason(ip: IPAddress) -> str | None:
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


def refusal(ip: IPAddress) -> Refusal | None:
    """Why a connection to `ip` is refused, or None when it is a public unicast address.

    The one judgement for submission and delivery. An IPv6 address that carries an IPv4
    address is judged by that IPv4 address (each of them: Teredo carries two), never by the
    IPv6 prefix's own flags, which differ between Python versions (3.11 calls 2002::/16
    global; 3.13 calls it private and judges ::ffff:0:0/96 by the IPv4 inside).
    """
    if isinstance(ip, ipaddress.IPv6Address):
        carried = carried_ipv4(ip)
        for form, v4 in carried:
            reason = _plain_reason(v4)
            if reason:
                return Refusal(reason, form, v4)
        if ip in _NAT64_LOCAL:
            # One network's own prefix (RFC 8215, not globally reachable), where the IPv4
            # address may sit elsewhere than the last 32 bits: refused whatever it carries.
            return Refusal("a local-use NAT64 address")
        if carried:
            return None  # a public IPv4 host, reached through a translator or relay
    reason = _plain_reason(ip)
    return Refusal(reason) if reason else None


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


def resolve(host: str, port: int, timeout_s: float | None = None) -> list[IPAddress]:
    """Every address of `host` (an IP literal resolves to itself), in resolver order, bounded in time."""
    timeout_s = RESOLVE_TIMEOUT_S if timeout_s is None else timeout_s  # read per call: tests stretch it
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
            why = refusal(ip)
            if why:
                where = why.where(ip) if _is_literal(host) else f"{host} resolves to {why.where(ip)}"
                raise UnsafeURL(f"must not point at {why.reason} ({where})")
    return addresses
