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
there. Cost: one file created and one removed per message (16 µs of CPU on this machine).
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
        _forget(delivery_tag)  # before: a requeued message may come straight back to this process
        reject(self, delivery_tag, requeue=requeue)

    @functools.wraps(restore_by_tag)
    def _restore_by_tag(self: Any, tag: str, client: Any = None, leftmost: bool = False) -> None:
        # kombu puts it back itself (a requeue, a channel closing at shutdown or on a lost
        # connection, the visibility sweep): no longer held here. Forgotten first, as in _reject:
        # once back in its queue this process may take it again and record it anew.
        _forget(tag)
        restore_by_tag(self, tag, client=client, leftmost=leftmost)

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
    killed = returncode < 0 or returncode == os.EX_SOFTWARE
    held = _records(folder, started_at) if killed and supported(settings.broker_url) else {}
    restored = _restore(settings, held) if held else 0
    if held:
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
    """Put the held messages back; how many were still there to put back.

    Where: the oldest delivery goes to the back of its queue, the others first in line. A
    worker's model runs its requests in the order they came (the batcher is first in, first
    out), so the oldest held message is the one most likely in the model's call when the
    process died: if it is what kills the process (a poison job), the job the other thread held
    runs before it next time instead of dying with it again and again, and a job put back
    behind the queue is what the prefork pool's lost-worker requeue did. The order comes from
    kombu's `unacked_index` (the delivery time, to the microsecond).

    Only this worker's deliveries: a tag stays with its message across deliveries, so one this
    worker held, that kombu already put back (a lost connection) and another worker took since,
    is in `unacked` again under the same tag, with an index time later than the record: it is
    left alone. Each check and move is one transaction (WATCH), like kombu's restore_by_tag.
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
            reads = client.pipeline(transaction=False)  # ZSCOREs, not ZMSCORE: Redis before 6.2 too
            for tag in held:
                reads.zscore(index, tag)
            scores = dict(zip(held, reads.execute(), strict=True))
            ours = sorted((since, tag) for tag, since in scores.items() if since is not None)
            # Pushed in this order: the oldest to the back, then the rest newest first, so that
            # the oldest of them is the first taken (kombu's consumers take from the head).
            order = [(tag, True) for _, tag in ours[:1]] + [(tag, False) for _, tag in reversed(ours[1:])]
            for tag, to_back in order:

                def move(
                    pipe: Any, tag: str = tag, recorded: float = held[tag], to_back: bool = to_back
                ) -> bool:
                    payload, since = pipe.hget(unacked, tag), pipe.zscore(index, tag)
                    pipe.multi()
                    if payload is None or since is None or since > recorded + CLOCK_SLACK_S:
                        return False  # acked, restored, or another delivery's now
                    pipe.zrem(index, tag).hdel(unacked, tag)
                    message, exchange, routing_key = loads(bytes_to_str(payload))
                    channel._do_restore_message(message, exchange, routing_key, pipe, to_back)
                    return True

                restored += bool(client.transaction(move, unacked, index, value_from_callable=True))
    return restored
