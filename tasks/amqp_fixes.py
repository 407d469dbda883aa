"""A narrow patch of py-amqp's TCP transport: a frame that stops arriving ends the connection.

What it fixes (issue 13, finding 2, RabbitMQ; reproduced with `bench/restarts.py
--rabbitmq-restarts 3`): after a RabbitMQ restart the threads-pool text worker's consumer
connection lost its framing (`UnexpectedFrame: Received frame_end 0x01`, the known py-amqp
thread-safety problem of celery/celery#6284 and celery/py-amqp#330), and its main thread then sat
in `basic_qos` -> `read_frame` -> `_read(size)` for ~90 s, reading the payload of a frame whose
header was garbage, until RabbitMQ dropped the connection for missed heartbeats. Nothing was
consumed meanwhile. `broker_socket_timeout_s` (SO_RCVTIMEO) alone does not end it: py-amqp retries
EAGAIN forever once a frame has started, and the broker's heartbeats keep trickling bytes into
the bogus payload.

The patch gives every frame a deadline: a frame header whose type is not an AMQP frame type
raises UnexpectedFrame at once, and a frame not complete `broker_socket_timeout_s` after its
header raises socket.timeout (TimeoutError). Both are connection errors to kombu, so the
consumer reconnects within seconds. Reads the event loop makes without blocking
(`drain_events(timeout=0)`) keep py-amqp's own behaviour.
"""

from __future__ import annotations

import functools
import struct
import time
from typing import Any

_PATCHED = "_genqueue_frame_deadline"
_FRAME_TYPES = frozenset({1, 2, 3, 8})  # method, header, body, heartbeat (AMQP 0-9-1, 4.2.3)


def _guarded_recv(transport: Any, recv: Any) -> Any:
    @functools.wraps(recv)
    def recv_before_deadline(*args: Any) -> Any:
        started = transport._genqueue_frame_started
        if started is not None and time.monotonic() - started > transport.read_timeout:
            raise TimeoutError("AMQP frame incomplete after broker_socket_timeout_s")
        try:
            return recv(*args)
        except BlockingIOError:
            # In blocking mode EAGAIN means SO_RCVTIMEO expired: the frame is late.
            if started is not None and transport.sock.gettimeout() is None:
                raise TimeoutError("AMQP frame incomplete after broker_socket_timeout_s") from None
            raise

    return recv_before_deadline


def install() -> bool:
    """Patch py-amqp's TCPTransport once per process; False if py-amqp is missing."""
    try:
        from amqp import transport
        from amqp.exceptions import UnexpectedFrame
    except ImportError:  # no AMQP transport in this install: nothing to patch
        return False
    tcp: Any = transport.TCPTransport  # _setup_transport, _read and _quick_recv are private
    if getattr(tcp._read, _PATCHED, False):
        return True
    setup, read = tcp._setup_transport, tcp._read

    @functools.wraps(setup)
    def _setup_transport(self: Any) -> None:
        setup(self)
        self._genqueue_frame_started = None
        if self.read_timeout:
            self._quick_recv = _guarded_recv(self, self._quick_recv)

    @functools.wraps(read)
    def _read(self: Any, n: int, initial: bool = False) -> bytes:
        if not initial:
            data: bytes = read(self, n, initial)
            return data
        self._genqueue_frame_started = None  # between frames: waiting is the event loop's business
        header: bytes = read(self, n, initial)
        if n == 7 and header[0] not in _FRAME_TYPES:
            frame_type, channel, size = struct.unpack(">BHI", header)
            self.connected = False
            raise UnexpectedFrame(f"frame type {frame_type} (channel {channel}, size {size}): desynchronised")
        self._genqueue_frame_started = time.monotonic()
        return header

    setattr(_read, _PATCHED, True)
    tcp._setup_transport, tcp._read = _setup_transport, _read
    return True


def uninstall() -> None:
    """Undo install() (the test that shows the stall without the patch)."""
    from amqp import transport

    tcp: Any = transport.TCPTransport
    if getattr(tcp._read, _PATCHED, False):
        tcp._setup_transport = tcp._setup_transport.__wrapped__
        tcp._read = tcp._read.__wrapped__
