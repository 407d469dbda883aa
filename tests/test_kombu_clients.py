"""tasks.kombu_clients: a kombu Redis channel builds one redis-py client, not one per command."""

from __future__ import annotations

from typing import Any

from kombu import Connection, Exchange, Producer, Queue

from tasks import kombu_clients


def test_a_channel_keeps_one_client_until_its_pool_is_replaced(redis_url: str, monkeypatch) -> None:
    kombu_clients.install()  # as create_celery does
    queue = Queue("kombu-clients-test", Exchange("kombu-clients-test"), routing_key="kombu-clients-test")
    with Connection(redis_url) as conn:
        channel: Any = conn.channel()
        built: list[Any] = []
        original = type(channel)._create_client

        def counted(self: Any, *args: Any, **kwargs: Any) -> Any:
            client = original(self, *args, **kwargs)
            built.append(client)
            return client

        monkeypatch.setattr(type(channel), "_create_client", counted)
        queue(channel).declare()
        producer = Producer(channel, exchange=queue.exchange, routing_key="kombu-clients-test")
        for i in range(5):
            producer.publish({"n": i}, serializer="json")
        assert len(built) == 1
        assert queue(channel).get(no_ack=True).payload == {"n": 0}  # the messages went out
        channel._pool = None  # what a reconnect does: a new pool, so a new client on it
        producer.publish({"n": 5}, serializer="json")
        assert len(built) == 2 and built[1].connection_pool is channel._pool
        assert queue(channel).purge() == 5


def test_uninstall_restores_kombus_own(redis_url: str) -> None:
    from kombu.transport import redis as kombu_redis

    kombu_clients.install()
    kombu_clients.uninstall()
    assert not getattr(kombu_redis.Channel.conn_or_acquire, "_genqueue_client_per_channel", False)
    kombu_clients.install()
    assert getattr(kombu_redis.Channel.conn_or_acquire, "_genqueue_client_per_channel", False)
