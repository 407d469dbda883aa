"""RabbitMQ: a connection whose replies stop raises a connection error after broker_socket_timeout_s."""

from __future__ import annotations

import socket
import struct
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tasks import amqp_fixes
from tasks.celery_app import create_celery

RABBIT = ("127.0.0.1", 5672)


class FreezableProxy:
    """A TCP proxy to RabbitMQ that can stop passing the broker's bytes while keeping the connection open.

    That is what a consumer sees when the AMQP stream stalls (a lost reply, a stream that lost
    its framing): the socket stays up and a blocking read waits for a frame that never comes.
    """

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.frozen = threading.Event()
        self.leak = 0  # bytes still passed after the freeze: 8 = a frame header and one payload byte
        self.sockets: list[socket.socket] = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            upstream = socket.create_connection(RABBIT)
            self.sockets += [client, upstream]
            self.client = client
            threading.Thread(target=self._pipe, args=(client, upstream, False), daemon=True).start()
            threading.Thread(target=self._pipe, args=(upstream, client, True), daemon=True).start()

    def _pipe(self, src: socket.socket, dst: socket.socket, from_broker: bool) -> None:
        try:
            while data := src.recv(65536):
                if from_broker and self.frozen.is_set():
                    data, self.leak = data[: self.leak], max(0, self.leak - len(data))
                    if not data:
                        continue  # swallowed: the client never sees (the rest of) the reply
                dst.sendall(data)
        except OSError:
            pass

    def close(self) -> None:
        for s in [self.listener, *self.sockets]:
            try:
                s.close()
            except OSError:
                pass


@pytest.fixture
def proxy() -> Iterator[FreezableProxy]:
    try:
        socket.create_connection(RABBIT, timeout=2).close()
    except OSError:
        pytest.skip("no RabbitMQ on 127.0.0.1:5672")
    p = FreezableProxy()
    yield p
    p.close()


def _blocked_qos(
    settings: Any, proxy: FreezableProxy, timeout_s: float, leak: int = 0, inject: Any = None
) -> tuple[Any, BaseException | None, float]:
    """Connect through the proxy, freeze it, call basic_qos: what it raised (None: still blocked), when."""
    url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//"
    app = create_celery(settings.model_copy(update={"broker_url": url, "broker_socket_timeout_s": timeout_s}),
                        set_as_current=False)  # fmt: skip
    conn = app.connection_for_read()
    conn.connect()
    # As a worker's consumer connection is (kombu sets this when it registers the connection
    # with the event loop): a read that times out before a frame starts raises socket.timeout.
    conn.connection.transport.raise_on_initial_eintr = True
    channel = conn.default_channel
    outcome: dict[str, Any] = {}

    def call() -> None:
        started = time.monotonic()
        try:
            channel.basic_qos(0, 1, False)
        except BaseException as exc:  # the test inspects whatever it raised
            outcome["error"] = exc
        outcome["after"] = time.monotonic() - started

    proxy.leak = leak
    proxy.frozen.set()
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    if inject is not None:
        inject(proxy.client)
    worker.join(timeout_s + 5 if timeout_s else 4)
    return conn, outcome.get("error"), outcome.get("after", float("inf"))


def test_a_stalled_reply_raises_a_connection_error_after_the_socket_timeout(settings, proxy) -> None:
    conn, error, after = _blocked_qos(settings, proxy, 1.0)
    assert error is not None, "basic_qos still blocked although the socket timeout passed"
    assert isinstance(error, conn.connection_errors), error  # so the consumer reconnects
    assert 0.8 <= after < 4, after


def test_without_the_timeout_the_same_call_blocks(settings, proxy) -> None:
    # The behaviour the setting exists for: 0 leaves py-amqp's default and the call waits on.
    _conn, error, after = _blocked_qos(settings, proxy, 0)
    assert error is None and after == float("inf"), (error, after)


def test_a_reply_stalled_mid_frame_raises_too(settings, proxy) -> None:
    # What the worker met after a RabbitMQ restart: a frame started (header read), the rest never
    # came. py-amqp alone retries that read forever; tasks.amqp_fixes makes it time out.
    conn, error, after = _blocked_qos(settings, proxy, 1.0, leak=8)
    assert error is not None, "basic_qos still blocked mid-frame although the socket timeout passed"
    assert isinstance(error, conn.connection_errors), error
    assert 0.8 <= after < 4, after


def test_a_frame_that_trickles_in_past_the_timeout_raises(settings, proxy) -> None:
    # The broker's heartbeats kept feeding bytes into a bogus frame's payload, so no single read
    # ever waited the socket timeout: the deadline is per frame, not per read.
    def trickle(client: socket.socket) -> None:
        client.sendall(struct.pack(">BHI", 1, 1, 100_000))  # a method frame claiming 100,000 bytes
        for _ in range(20):
            time.sleep(0.2)
            client.sendall(b"x")

    conn, error, after = _blocked_qos(settings, proxy, 1.0, inject=trickle)
    assert isinstance(error, conn.connection_errors), error
    assert 0.8 <= after < 3, after


def test_a_garbage_frame_header_raises_at_once(settings, proxy) -> None:
    conn, error, after = _blocked_qos(
        settings, proxy, 5.0, inject=lambda c: c.sendall(b"\x41\x00\x01\x00\x00\x01\x00")
    )
    assert isinstance(error, conn.connection_errors), error
    assert "desynchronised" in str(error) and after < 2, (error, after)


def test_without_the_patch_a_read_stalled_mid_frame_blocks(settings, proxy) -> None:
    try:
        amqp_fixes.uninstall()
        settings = settings.model_copy(update={"broker_socket_timeout_s": 1.0})
        url = f"amqp://guest:guest@127.0.0.1:{proxy.port}//"
        app = create_celery(settings.model_copy(update={"broker_url": url}), set_as_current=False)
        amqp_fixes.uninstall()  # create_celery installed it again
        conn = app.connection_for_read()
        conn.connect()
        conn.connection.transport.raise_on_initial_eintr = True
        channel = conn.default_channel
        proxy.leak = 8
        proxy.frozen.set()
        done = threading.Event()
        threading.Thread(target=lambda: (channel.basic_qos(0, 1, False), done.set()), daemon=True).start()
        assert not done.wait(4), "returned although the reply never completed"
    finally:
        amqp_fixes.install()
