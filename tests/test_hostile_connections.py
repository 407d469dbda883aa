"""The production web server (ops/gunicorn.conf.py) against idle, trickling and malformed connections."""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from tests.support.procs import gunicorn_web


def _problem(raw: bytes) -> tuple[int, dict]:
    head, _, body = raw.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    assert b"content-type: application/problem+json" in head.lower(), head
    return status, json.loads(body)


@pytest.fixture
def web(settings, sessions, tmp_path) -> Iterator[str]:
    """gunicorn with the production config and one worker process (the smallest deployment)."""
    with gunicorn_web(settings, tmp_path / "gunicorn.log", GENQUEUE_WEB_BODY_TIMEOUT_S=3) as base:
        yield base


def _raw(port: int, data: bytes, timeout: float = 10) -> bytes:
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(data)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def _port(base: str) -> int:
    return int(base.rsplit(":", 1)[1])


@pytest.mark.slow
def test_good_client_is_served_while_hostile_connections_are_held(web: str, api_key: str) -> None:
    """With gthread (a thread per waiting connection, 8 of them) these requests time out."""
    port = _port(web)
    stop = threading.Event()
    held: list[socket.socket] = []

    def trickle(first: bytes, byte: bytes) -> None:
        while not stop.is_set():
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=2) as s:
                    s.sendall(first)
                    while not stop.wait(0.5):
                        s.sendall(byte)
            except OSError:
                continue  # dropped by the server: come back, as an attacker would

    for _ in range(300):
        held.append(socket.create_connection(("127.0.0.1", port)))
    slow = [
        threading.Thread(target=trickle, args=(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n", b"X"), daemon=True)
        for _ in range(20)
    ] + [
        threading.Thread(
            target=trickle,
            args=(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 50000\r\n\r\n{", b" "),
            daemon=True,
        )
        for _ in range(20)
    ]
    for t in slow:
        t.start()
    try:
        headers = {"Authorization": f"Bearer {api_key}"}
        failures = []
        with httpx.Client(base_url=web, headers=headers, timeout=5) as client:
            for n in range(30):
                try:
                    if n % 2:
                        r = client.get("/v1/health")
                    else:
                        r = client.post("/v1/jobs", json={"prompt": f"a kite {n}", "modality": "text"})
                    if r.status_code >= 400:
                        failures.append(r.status_code)
                except httpx.HTTPError as exc:
                    failures.append(type(exc).__name__)
        assert failures == []
    finally:
        stop.set()
        for s in held:
            s.close()


@pytest.mark.slow
def test_silent_and_slow_header_connections_are_closed(web: str) -> None:
    port = _port(web)
    started = time.monotonic()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        assert s.recv(1) == b""  # closed without an answer: nothing was asked
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"GET /v1/health HTTP/1.1\r\nHost: x\r\n")
        closed = False
        for _ in range(60):
            try:
                s.sendall(b"X")
            except OSError:
                closed = True
                break
            s.settimeout(0.5)
            try:
                if s.recv(1) == b"":
                    closed = True
                    break
            except TimeoutError:
                pass
        assert closed
    # keepalive is 5 s for each; well before 30 s means the server, not the client, gave up.
    assert time.monotonic() - started < 25


@pytest.mark.slow
def test_slow_body_gets_408_problem(web: str, sessions) -> None:
    port = _port(web)
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(b"POST /v1/jobs HTTP/1.1\r\nHost: x\r\nContent-Length: 500\r\n\r\n{")
        raw = b""
        for _ in range(60):  # a byte every half second: the body deadline (3 s here) runs out first
            try:
                s.sendall(b" ")
            except OSError:
                break
            s.settimeout(0.5)
            try:
                chunk = s.recv(65536)
            except TimeoutError:
                continue
            except ConnectionResetError:
                break  # after the answer: the server closed while we were still sending
            if not chunk:
                break
            raw += chunk
    status, body = _problem(raw)
    assert status == 408 and body["status"] == 408


@pytest.mark.slow
def test_protocol_errors_are_problem_json_and_echo_nothing(web: str) -> None:
    port = _port(web)
    secret = "gq_live_" + "s" * 40
    line = f"GET /v1/jobs/{secret}{'a' * 9000} HTTP/1.1\r\nHost: x\r\n\r\n"
    status, body = _problem(_raw(port, line.encode()))
    assert status == 414 and body["status"] == 414
    assert secret not in json.dumps(body)
    many = "".join(f"X-{n}: {secret}\r\n" for n in range(150))
    status, body = _problem(_raw(port, f"GET /v1/health HTTP/1.1\r\nHost: x\r\n{many}\r\n".encode()))
    assert status == 431 and secret not in json.dumps(body)
    big = "X-Big: " + "b" * 9000
    status, body = _problem(_raw(port, f"GET /v1/health HTTP/1.1\r\nHost: x\r\n{big}\r\n\r\n".encode()))
    assert status == 431


@pytest.mark.slow
def test_bodies_at_normal_speed_still_work_and_oversized_ones_get_413(web: str, api_key: str) -> None:
    headers = {"Authorization": f"Bearer {api_key}"}
    r = httpx.post(f"{web}/v1/jobs", json={"prompt": "a quiet harbour", "modality": "text"}, headers=headers)
    assert r.status_code == 202, r.text

    def chunks() -> Iterator[bytes]:
        for _ in range(100):
            yield b" " * 1024  # 100 KB chunked, over the 64 KB limit

    r = httpx.post(f"{web}/v1/jobs", content=chunks(), headers=headers | {"Content-Type": "application/json"})
    assert r.status_code == 413, r.text
    assert r.headers["content-type"].startswith("application/problem+json")
