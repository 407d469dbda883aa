"""Messages waiting in each broker queue, per priority level, read from the broker itself.

Redis (kombu): a queue with priority steps is one list per step, `text` for step 0 and
`text\\x06\\x163` for step 3 and so on, so each priority level has its own depth. RabbitMQ keeps
priorities inside one queue: a passive declare gives its ready messages, labelled priority "all".
Both count messages not yet delivered to a worker: those a worker holds unacked are not waiting.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis
from amqp.exceptions import NotFound
from kombu import Connection
from kombu.transport.redis import Channel

from tasks.contract.names import ALL_QUEUES
from tasks.contract.routing import REDIS_PRIORITY, is_amqp

ALL_PRIORITIES = "all"  # RabbitMQ: one queue holds every priority
# Redis priority step -> the job priority published at it (tasks.contract.routing).
REDIS_STEPS = {step: name for name, step in REDIS_PRIORITY.items()}


def redis_key(queue: str, step: int) -> str:
    """kombu's list for `queue` at priority `step` (kombu.transport.redis.Channel._q_for_pri)."""
    return f"{queue}{Channel.sep}{step}" if step else queue


class QueueDepths:
    """Reads (queue, priority) -> messages waiting, each call within `timeout_s` per broker operation."""

    def __init__(self, broker_url: str, timeout_s: float) -> None:
        self.broker_url, self.timeout_s = broker_url, timeout_s
        self._redis: redis.Redis | None = None
        if broker_url.startswith(("redis://", "rediss://")):
            self._redis = redis.Redis.from_url(
                broker_url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s
            )
        elif not is_amqp(broker_url):
            raise ValueError("queue depths are read from Redis or RabbitMQ brokers only")

    def read(self) -> dict[tuple[str, str], int]:
        return self._read_redis() if self._redis is not None else self._read_amqp()

    def _read_redis(self) -> dict[tuple[str, str], int]:
        assert self._redis is not None
        keys = [
            (q, name, redis_key(q, step)) for q in ALL_QUEUES for step, name in sorted(REDIS_STEPS.items())
        ]
        pipe = self._redis.pipeline(transaction=False)  # one round trip for every list
        for _, _, key in keys:
            pipe.llen(key)
        lengths: list[Any] = pipe.execute()
        return {(q, name): int(n) for (q, name, _), n in zip(keys, lengths, strict=True)}

    def _read_amqp(self) -> dict[tuple[str, str], int]:
        out = {}
        with self._connection() as conn:
            channel: Any = conn.channel()  # py-amqp's Channel (kombu types it as the generic StdChannel)
            for queue in ALL_QUEUES:
                try:
                    ok = channel.queue_declare(queue=queue, passive=True)
                except NotFound:  # never declared: nothing waits in it; the broker closed the channel
                    out[(queue, ALL_PRIORITIES)] = 0
                    channel = conn.channel()
                    continue
                out[(queue, ALL_PRIORITIES)] = int(ok.message_count)
        return out

    @contextmanager
    def _connection(self) -> Iterator[Connection]:
        # A fresh connection per scrape: nothing to keep alive between scrapes (no heartbeats).
        t = self.timeout_s
        options = {"read_timeout": t, "write_timeout": t}
        with Connection(self.broker_url, connect_timeout=t, transport_options=options) as conn:
            conn.connect()
            yield conn

    def close(self) -> None:
        if self._redis is not None:
            self._redis.close()
