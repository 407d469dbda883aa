"""A narrow patch of kombu 5.7's Redis transport: a closed transport raises a connection error.

The crash it prevents (issue 13, finding 2; reproduced with bench/restarts.py and traced): on a
broker connection loss Celery's consumer (`on_connection_error_after_connected`) calls
`Connection.collect()`, which ends with `transport.client = None`, and then `Connection.close()`,
which closes the default channel once more. When that close is the one that gets through (the
earlier ones stopped at a connection error while Redis was down), it drops the channel's
connection pool and restores the unacked messages (`Restoring N unacknowledged message(s)`);
rebuilding the pool reads `transport.client.hostname` in `Channel._connparams`, and the
AttributeError escapes `ignore_errors` (it swallows connection errors only) and the consumer:
the worker logs `Unrecoverable error` and exits. It needs a channel in BRPOP with free slots
when the connection drops, so a worker with idle threads hits it on about one restart in three.

Upstream fixed the neighbouring stale-timer crashes on reconnect (celery/kombu#2498,
celery/celery#10218, both in 5.7) but not this path; celery/kombu#582 is an older report of
the same AttributeError from a close on a closed transport. Raising redis's ConnectionError
instead says what happened, a lost connection, which kombu and Celery already handle: the
close is ignored, the consumer reconnects, the unacked messages come back after the
visibility timeout (or from the reaper), and every stage is idempotent.
"""

from __future__ import annotations

import functools
from typing import Any

_PATCHED = "_genqueue_closed_transport_guard"


def install() -> bool:
    """Patch kombu's Redis Channel once per process; False if kombu or redis is missing."""
    try:
        import redis
        from kombu.transport import redis as kombu_redis
    except ImportError:  # no Redis transport in this install: nothing to patch
        return False
    channel_cls: Any = kombu_redis.Channel  # _connparams is private: the stubs do not declare it
    if getattr(channel_cls._connparams, _PATCHED, False):
        return True
    original = channel_cls._connparams

    @functools.wraps(original)
    def _connparams(self: Any, asynchronous: bool = False) -> dict[str, Any]:
        transport = self.connection
        if transport is None or transport.client is None:
            # redis's ConnectionError is in Channel.connection_errors: callers treat it as
            # a lost connection (ignore it on close, reconnect in the consumer).
            raise redis.exceptions.ConnectionError("kombu transport already closed (connection lost)")
        params: dict[str, Any] = original(self, asynchronous=asynchronous)
        return params

    setattr(_connparams, _PATCHED, True)
    channel_cls._connparams = _connparams
    return True


def uninstall() -> None:
    """Undo install() (tests that show the crash without the patch)."""
    from kombu.transport import redis as kombu_redis

    channel_cls: Any = kombu_redis.Channel
    current = channel_cls._connparams
    if getattr(current, _PATCHED, False):
        channel_cls._connparams = current.__wrapped__
