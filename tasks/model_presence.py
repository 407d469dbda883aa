"""A worker process announces its loaded models (models.presence) after each load or unload, and on a beat."""

from __future__ import annotations

import logging
import os
import socket
import threading

import redis

from models import presence
from models.settings import Settings
from tasks.generators import registry

log = logging.getLogger(__name__)

_started: dict[tuple[int, str], threading.Event] = {}  # (pid, Redis URL) -> wakes the beat early
_lock = threading.Lock()


def _owner() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"


def _loaded() -> list[tuple[str, str]]:
    return sorted({(kind, spec) for kind, spec, _dtype in registry.loaded()})


def start(settings: Settings) -> None:
    """Announce from this process from now on (idempotent; a forked child starts its own)."""
    key = (os.getpid(), settings.ratelimit_storage_uri)
    conn = presence.client(settings.ratelimit_storage_uri)
    if conn is None:
        return  # no shared Redis to announce in (the embedded mode); `warm` is then unknown
    with _lock:
        if key in _started:
            return
        wake = _started[key] = threading.Event()
    registry.on_change(wake.set)
    every = settings.model_heartbeat_s
    threading.Thread(
        target=_beat, args=(conn, every, wake), name="genqueue-model-presence", daemon=True
    ).start()


def _beat(conn: redis.Redis, every: float, wake: threading.Event) -> None:
    while True:
        wake.clear()  # before reading: a load announced meanwhile wakes the next round at once
        try:
            presence.announce(conn, _owner(), _loaded(), 3 * every)
        except Exception as exc:  # Redis away: models still serve; `warm` is only a hint
            log.debug("cannot announce loaded models: %s", exc)
        wake.wait(every)
