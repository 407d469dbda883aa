"""The Redis messages a worker process holds, on disk, so its supervisor can put them back if it is killed.

On Redis, a message a worker has taken but not acked waits in kombu's `unacked` hash. A worker
that stops (warm or cold) restores them itself; one killed outright (the OOM killer, a segfault
in a model library, SIGKILL) cannot, and they come back only after the visibility timeout
(`GENQUEUE_BROKER_VISIBILITY_TIMEOUT_S`, 2 h) or when the reaper calls the stage overdue. Each
command-line worker therefore keeps one empty file per held delivery tag in
`<worker_held_dir>/<pid>/` (made when kombu's QoS has taken the message, removed when it is
acked, rejected or put back by kombu), and `genqueue worker` (app/cli.py), seeing its Celery
process die of a signal, puts exactly those messages back before it starts the next one.

Never twice: a tag already acked or put back is no longer in `unacked`, and a later delivery of
the same message (same tag) to another worker is told apart by its time (see _restore); even so,
the stages are idempotent. RabbitMQ requeues a dead connection's messages itself: nothing to do
there. Cost: one file created and one removed per message (tens of microseconds).
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
# A record's file time (the kernel's coarse clock, up to a few ms behind) and kombu's unacked time
# or a run's start come from the same host; a redelivery to another worker comes much later.
CLOCK_SLACK_S = 0.05
_folder: Path | None = None  # this process's folder while recording


def folder_for(settings: Settings, pid: int) -> Path:
    return Path(settings.worker_held_dir) / str(pid)


def _path(tag: str | bytes) -> Path | None:
    """The record of `tag` (kombu passes tags read back from Redis as bytes), if recording."""
    if _folder is None:
        return None
    name = tag.decode() if isinstance(tag, bytes) else str(tag)
    return _folder / name if name and "/" not in name else None


def _touch(tag: str | bytes) -> None:
    # Inside kombu's consume and ack paths: a failure here must never reach them (a full or
    # read-only disk only costs the fast restore).
    with contextlib.suppress(Exception):
        if (path := _path(tag)) is not None:
            path.touch()


def _forget(tag: str | bytes) -> None:
    with contextlib.suppress(Exception):
        if (path := _path(tag)) is not None:
            path.unlink(missing_ok=True)


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
    append, ack, reject, restore_by_tag = qos.append, qos.ack, qos.reject, qos.restore_by_tag

    @functools.wraps(append)
    def _append(self: Any, message: Any, delivery_tag: str) -> None:
        append(self, message, delivery_tag)
        _touch(delivery_tag)  # after: the file is never older than the unacked entry it stands for

    @functools.wraps(ack)
    def _ack(self: Any, delivery_tag: str) -> None:
        ack(self, delivery_tag)
        _forget(delivery_tag)

    @functools.wraps(reject)
    def _reject(self: Any, delivery_tag: str, requeue: bool = False) -> None:
        # Before: a requeued message may come straight back to this process, which records it anew.
        _forget(delivery_tag)
        reject(self, delivery_tag, requeue=requeue)

    @functools.wraps(restore_by_tag)
    def _restore_by_tag(self: Any, tag: str, client: Any = None, leftmost: bool = False) -> None:
        # kombu put it back itself (a channel closing at shutdown or on a lost connection, the
        # visibility sweep): no longer held here.
        restore_by_tag(self, tag, client=client, leftmost=leftmost)
        _forget(tag)

    for fn in (_append, _ack, _reject, _restore_by_tag):
        setattr(fn, _PATCHED, True)
    qos.append, qos.ack, qos.reject, qos.restore_by_tag = _append, _ack, _reject, _restore_by_tag


def stop_recording() -> None:
    """At a clean shutdown: the worker restored or acked what it held; drop the folder."""
    global _folder
    folder, _folder = _folder, None
    if folder is not None:
        shutil.rmtree(folder, ignore_errors=True)


def after_exit(settings: Settings, pid: int, returncode: int, started_at: float) -> int:
    """In the supervisor, after worker `pid` (started at Unix time `started_at`) ended: put back
    what it could not; how many messages.

    Killed by a signal (returncode < 0), or left by hang_guard's os._exit when its cold shutdown
    hung: what it recorded may still be in `unacked`. Any other exit restored or acked its
    messages itself; its folder is only dropped. Only records of this run count (a folder left
    by an earlier process with the same pid is not), and _restore puts back only the deliveries
    they stand for, never a later one of the same message (its tag) to another worker.
    """
    folder = folder_for(settings, pid)
    held = _records(folder, started_at)
    restored = 0
    if held and (returncode < 0 or returncode == os.EX_SOFTWARE) and supported(settings.broker_url):
        restored = _restore(settings, held)
        log.warning("worker %d held %d message(s): put back in their queues", pid, restored)
    shutil.rmtree(folder, ignore_errors=True)
    return restored


def _records(folder: Path, since: float) -> dict[str, float]:
    """delivery tag -> when it was recorded, for the records in `folder` made since `since`."""
    held: dict[str, float] = {}
    with contextlib.suppress(OSError):
        for path in folder.iterdir():
            with contextlib.suppress(OSError):
                if (recorded := path.stat().st_mtime) >= since - CLOCK_SLACK_S:
                    held[path.name] = recorded
    return held


def _restore(settings: Settings, held: dict[str, float]) -> int:
    """Put each held message back at the head of its queue (next to be taken, as kombu's own
    restores do); how many were still there to put back.

    A tag stays with its message across deliveries, so one this worker held, that kombu already
    put back (a lost connection) and another worker took since, is in `unacked` again under the
    same tag: its entry's time (the `unacked_index` score, written just before our record) is
    then later than the record, and it is left alone. The check and the move are one
    transaction (WATCH), like kombu's restore_by_tag.
    """
    from kombu.utils.encoding import bytes_to_str
    from kombu.utils.json import loads

    from tasks.celery_app import create_celery

    app = create_celery(settings, set_as_current=False)
    restored = 0
    with app.connection_for_write() as conn:
        channel: Any = conn.default_channel  # kombu's Redis Channel: its internals are not in the stubs
        unacked, index = channel.unacked_key, channel.unacked_index_key
        with channel.conn_or_acquire() as client:
            for tag, recorded in held.items():

                def move(pipe: Any, tag: str = tag, recorded: float = recorded) -> bool:
                    payload, since = pipe.hget(unacked, tag), pipe.zscore(index, tag)
                    pipe.multi()
                    if payload is None or since is None or since > recorded + CLOCK_SLACK_S:
                        return False  # acked, restored, or another delivery's now
                    pipe.zrem(index, tag).hdel(unacked, tag)
                    message, exchange, routing_key = loads(bytes_to_str(payload))
                    channel._do_restore_message(message, exchange, routing_key, pipe, False)
                    return True

                restored += bool(client.transaction(move, unacked, index, value_from_callable=True))
    return restored
