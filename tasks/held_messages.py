"""The Redis messages a worker process holds, on disk, so its supervisor can put them back if it is killed.

On Redis, a message a worker has taken but not acked waits in kombu's `unacked` hash. A worker
that stops (warm or cold) restores them itself; one killed outright (the OOM killer, a segfault
in a model library, SIGKILL) cannot, and they come back only after the visibility timeout
(`GENQUEUE_BROKER_VISIBILITY_TIMEOUT_S`, 2 h) or when the reaper calls the stage overdue. Each
command-line worker therefore keeps one empty file per held delivery tag in
`<worker_held_dir>/<pid>/` (created when kombu's QoS takes the message, removed when it is
acked or rejected), and `genqueue worker` (app/cli.py), seeing its Celery process die of a
signal, restores exactly those tags with kombu's own `QoS.restore_by_tag` before it starts the
next one.

Safe by construction: a tag already acked, or restored by someone else, is no longer in the
hash, and restoring it does nothing; a message restored once more than needed runs through
idempotent stages. RabbitMQ requeues a dead connection's messages itself: nothing to do there.
Cost: one file created and one removed per message (tens of microseconds).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from models.settings import Settings
from tasks.inflight import supported

log = logging.getLogger("genqueue.held")

_PATCHED = "_genqueue_held_messages"
_folder: Path | None = None  # this process's folder while recording


def folder_for(settings: Settings, pid: int) -> Path:
    return Path(settings.worker_held_dir) / str(pid)


def _touch(tag: str) -> None:
    if _folder is not None:
        with contextlib.suppress(OSError):  # a full or read-only disk costs only the fast restore
            (_folder / tag).touch()


def _forget(tag: str) -> None:
    if _folder is not None:
        with contextlib.suppress(OSError):
            (_folder / tag).unlink(missing_ok=True)


def record(settings: Settings) -> bool:
    """In the worker's main process (the one that consumes): keep the held tags from now on."""
    global _folder
    if not supported(settings.broker_url):
        return False
    folder = folder_for(settings, os.getpid())
    try:
        shutil.rmtree(folder, ignore_errors=True)  # a leftover of an earlier process with this pid
        folder.mkdir(parents=True)
    except OSError as exc:
        log.warning("not recording held messages in %s (%s): a killed worker's come back later", folder, exc)
        return False
    _folder = folder
    _patch()
    return True


def _patch() -> None:
    from kombu.transport import redis as kombu_redis

    qos: Any = kombu_redis.QoS
    if getattr(qos.append, _PATCHED, False):
        return
    append, ack, reject = qos.append, qos.ack, qos.reject

    @functools.wraps(append)
    def _append(self: Any, message: Any, delivery_tag: str) -> None:
        _touch(delivery_tag)
        append(self, message, delivery_tag)

    @functools.wraps(ack)
    def _ack(self: Any, delivery_tag: str) -> None:
        ack(self, delivery_tag)
        _forget(delivery_tag)

    @functools.wraps(reject)
    def _reject(self: Any, delivery_tag: str, requeue: bool = False) -> None:
        reject(self, delivery_tag, requeue=requeue)
        _forget(delivery_tag)

    for fn in (_append, _ack, _reject):
        setattr(fn, _PATCHED, True)
    qos.append, qos.ack, qos.reject = _append, _ack, _reject


def stop_recording() -> None:
    """At a clean shutdown: the worker restored or acked what it held; drop the folder."""
    global _folder
    folder, _folder = _folder, None
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def after_exit(settings: Settings, pid: int, returncode: int) -> int:
    """In the supervisor, after worker `pid` ended: put back what it could not; how many tags.

    Killed by a signal (returncode < 0), or left by hang_guard's os._exit when its cold shutdown
    hung: the worker restored nothing, so its recorded tags go back. Any other exit restored or
    acked them itself; its folder is only dropped (a restored message may already be with
    another worker under the same tag, and must not be put back twice).
    """
    folder = folder_for(settings, pid)
    tags = sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []
    if tags and (returncode < 0 or returncode == os.EX_SOFTWARE) and supported(settings.broker_url):
        _restore(settings, tags)
        log.warning("worker %d held %d message(s): put back in their queues", pid, len(tags))
    else:
        tags = []
    shutil.rmtree(folder, ignore_errors=True)
    return len(tags)


def _restore(settings: Settings, tags: list[str]) -> None:
    from tasks.celery_app import create_celery

    app = create_celery(settings, set_as_current=False)
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel  # kombu's Redis Channel: its QoS is not in the stubs
        qos = channel.qos
        for tag in tags:
            # leftmost: the head of the list, where BRPOP takes, as kombu's own reject does
            qos.restore_by_tag(tag, leftmost=True)
