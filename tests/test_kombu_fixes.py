"""tasks.kombu_fixes: a Redis channel of a closed transport raises a connection error, not AttributeError.

The state the worker crashed in (traced in issue 13, finding 2): `Connection.collect()` has
cleared `transport.client`, and the default channel's close drops its pool and then restores
the unacked messages, which needs a new pool. The slow proof with real workers and Redis
restarts is tests/test_restarts.py; this pins the mechanism in a second.
"""

from __future__ import annotations

import pytest
import redis
from kombu import Connection

from tasks import kombu_fixes


def _closed_transport_channel(broker_url: str):
    conn = Connection(broker_url)
    channel = conn.default_channel
    channel.client.ping()  # connected once, as a consuming worker's channel is
    channel._disconnect_pools()  # what Channel.close() does before restoring unacked messages
    conn.transport.client = None  # what Connection.collect() leaves behind
    return channel


def test_a_channel_of_a_closed_transport_raises_a_connection_error(settings):
    kombu_fixes.install()
    channel = _closed_transport_channel(settings.broker_url)
    with pytest.raises(redis.exceptions.ConnectionError):
        channel.qos.restore_unacked()
    # Which kombu and Celery treat as a lost connection (ignore_errors, the consumer's reconnect).
    assert isinstance(redis.exceptions.ConnectionError("x"), channel.connection_errors)


def test_without_the_patch_it_is_the_attribute_error_that_killed_the_worker(settings):
    kombu_fixes.uninstall()
    try:
        channel = _closed_transport_channel(settings.broker_url)
        with pytest.raises(AttributeError, match="hostname"):
            channel.qos.restore_unacked()
    finally:
        kombu_fixes.install()


def test_install_is_idempotent():
    from kombu.transport import redis as kombu_redis

    kombu_fixes.install()
    patched = kombu_redis.Channel._connparams
    kombu_fixes.install()
    assert kombu_redis.Channel._connparams is patched
    assert patched.__wrapped__.__name__ == "_connparams"  # one layer, not two
    assert not hasattr(patched.__wrapped__, "__wrapped__")
