"""tasks/held_messages.py against the run's Redis: what kombu's QoS records while a worker holds a
message, and what `genqueue worker` puts back once that worker was killed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kombu import Queue

from models.settings import Settings
from tasks import held_messages
from tasks.celery_app import create_celery

QUEUE = "held-test"


@pytest.fixture
def held(settings: Settings, tmp_path: Path, broker) -> Iterator[tuple[Settings, Path, Any]]:
    """Recording in this process, as a command-line worker does; (settings, its folder, a channel)."""
    s = settings.model_copy(update={"worker_held_dir": tmp_path})
    started = time.time()
    assert held_messages.record(s)
    app = create_celery(s, set_as_current=False)
    conn = app.connection_for_write()
    try:
        channel = conn.default_channel
        channel.started = started
        yield s, held_messages.folder_for(s, os.getpid()), channel
    finally:
        held_messages.stop_recording()
        conn.release()


def _publish(channel: Any, n: int) -> None:
    channel.connection.client.Producer(channel).publish({"n": n}, routing_key=QUEUE, declare=[Queue(QUEUE)])


def _take(channel: Any) -> Any:
    """The next message, delivered and not acked, as a consumer takes it (kombu's QoS.append)."""
    message = channel.basic_get(QUEUE, no_ack=False)
    assert message is not None, "the queue is empty"
    return message


def _killed(s: Settings, channel: Any, returncode: int = -9, started_at: float | None = None) -> int:
    """What the supervisor does after this 'worker' died: the folder is left as the kill left it."""
    held_messages._folder = None  # a killed process records nothing more
    return held_messages.after_exit(s, os.getpid(), returncode, started_at or channel.started)


def test_a_message_is_recorded_from_its_delivery_until_it_is_acked_or_rejected(held) -> None:
    _, folder, channel = held
    _publish(channel, 0)
    first = _take(channel)
    assert sorted(p.name for p in folder.iterdir()) == [first.delivery_tag]
    first.ack()
    assert list(folder.iterdir()) == []

    _publish(channel, 1)
    second = _take(channel)
    second.reject(requeue=True)  # back in the queue: no longer held here
    assert list(folder.iterdir()) == []
    again = _take(channel)
    assert again.delivery_tag == second.delivery_tag  # a tag stays with its message
    assert [p.name for p in folder.iterdir()] == [again.delivery_tag]
    # kombu puts it back itself: its visibility sweep passes the tag as Redis returned it, bytes.
    channel.qos.restore_by_tag(again.delivery_tag.encode())
    assert list(folder.iterdir()) == []


def test_a_killed_workers_messages_go_back_once_the_oldest_behind_the_queue(held) -> None:
    """The oldest held message was the model's (first in, first out): the likeliest to have
    killed the worker, it goes to the back; the others are first in line, oldest first."""
    s, folder, channel = held
    for n in range(4):
        _publish(channel, n)
    for _ in range(3):
        _take(channel)  # n=0 (oldest), 1 and 2 held; n=3 waits in the queue
    assert len(list(folder.iterdir())) == 3
    assert _killed(s, channel) == 3
    assert not folder.exists()
    assert channel.client.hlen(channel.unacked_key) == 0
    order = [channel.basic_get(QUEUE, no_ack=True).payload["n"] for _ in range(4)]
    assert order == [1, 2, 3, 0]
    assert channel.basic_get(QUEUE, no_ack=True) is None  # nothing put back twice


def test_a_later_delivery_of_the_same_message_to_another_worker_is_left_alone(held) -> None:
    s, folder, channel = held
    _publish(channel, 0)
    message = _take(channel)
    record = folder / message.delivery_tag
    # The record predates the entry now in `unacked`: as after kombu put the message back and
    # another worker took it again (same tag, a later time).
    earlier = time.time() - 5
    os.utime(record, (earlier, earlier))
    assert _killed(s, channel, started_at=earlier - 1) == 0
    assert channel.client.hexists(channel.unacked_key, message.delivery_tag)  # still that worker's
    assert channel.basic_get(QUEUE, no_ack=True) is None


@pytest.mark.parametrize("returncode", [0, 1])
def test_a_worker_that_stopped_by_itself_has_nothing_put_back(held, returncode: int) -> None:
    s, folder, channel = held
    _publish(channel, 0)
    _take(channel)
    assert _killed(s, channel, returncode=returncode) == 0  # it restored (or acked) its own
    assert not folder.exists()
    assert channel.basic_get(QUEUE, no_ack=True) is None


def test_records_older_than_the_run_are_not_its_own(held) -> None:
    """A folder left by an earlier process with the same pid: the run that died never took those."""
    s, folder, channel = held
    _publish(channel, 0)
    _take(channel)
    assert _killed(s, channel, started_at=time.time() + 60) == 0
    assert not folder.exists()


def test_hang_guards_exit_puts_messages_back(held) -> None:
    s, _, channel = held
    _publish(channel, 0)
    _take(channel)
    assert _killed(s, channel, returncode=os.EX_SOFTWARE) == 1


def test_nothing_is_recorded_on_rabbitmq(settings: Settings, tmp_path: Path) -> None:
    amqp = settings.model_copy(
        update={"broker_url": "amqp://guest:guest@127.0.0.1:5672//", "worker_held_dir": tmp_path}
    )
    assert not held_messages.record(amqp)
    assert list(tmp_path.iterdir()) == []
