"""A job's message from a template is the message Celery's send_task builds for it, byte for byte:
on the wire through Redis, and as publish() arguments for either broker's priorities."""

from __future__ import annotations

import base64
import json
import uuid
from typing import Any

import pytest
from kombu import Connection
from kombu.serialization import dumps

from models.settings import Settings
from tasks.celery_app import create_celery
from tasks.contract import publish
from tasks.contract.templates import PLACEHOLDER, templates


class FakeProducer:
    """Records publish() calls; the connection is never opened (send_task only enters its error context)."""

    def __init__(self, url: str) -> None:
        self.connection = Connection(url)
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def publish(self, body: Any, **kwargs: Any) -> None:
        self.calls.append((body, kwargs))


def _on_the_wire(body: Any, kwargs: dict[str, Any]) -> tuple[bytes, dict[str, Any]]:
    """What kombu's Producer would put on the wire: the body's bytes and the other arguments."""
    kwargs = dict(kwargs)
    if "serializer" in kwargs:
        content_type, encoding, body = dumps(body, serializer=kwargs.pop("serializer"))
        kwargs.update(content_type=content_type, content_encoding=encoding)
    return body.encode(kwargs["content_encoding"]), kwargs


@pytest.mark.parametrize("broker_url", ["redis://127.0.0.1:6379/0", "amqp://guest:guest@127.0.0.1:5672//"])
@pytest.mark.parametrize(
    ("modality", "priority", "stage"),
    [
        ("video", "normal", "text"),
        ("text", "high", "text"),
        ("storyboard", "low", "text"),
        ("video", "low", "video"),
    ],
)
def test_a_template_publishes_what_send_task_would(broker_url, modality, priority, stage) -> None:
    app = create_celery(Settings(broker_url=broker_url), set_as_current=False)
    jid = str(uuid.uuid4())
    direct, templated = FakeProducer(broker_url), FakeProducer(broker_url)
    publish._send_stages(app, jid, modality, priority, stage, direct)  # type: ignore[arg-type]
    for _ in range(2):  # recorded on the first call, reused on the second
        publish.publish_job(app, jid, modality, priority, stage, producer=templated)  # type: ignore[arg-type]
    [(body, kwargs)] = direct.calls
    want = _on_the_wire(body, kwargs)
    assert [_on_the_wire(*call) for call in templated.calls] == [want, want]
    assert jid in want[0].decode() and PLACEHOLDER not in want[0].decode() + repr(want[1])
    assert len(templates(app)._by_key) == 1


def test_each_job_gets_its_own_ids_and_a_batch_declares_its_queue_once() -> None:
    app = create_celery(Settings(broker_url="redis://127.0.0.1:6379/0"), set_as_current=False)
    producer, declared = FakeProducer(app.conf.broker_url), set[Any]()
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    for jid in (a, b):
        publish.publish_job(app, jid, "video", "normal", producer=producer, declared=declared)  # type: ignore[arg-type]
    (body_a, kw_a), (_, kw_b) = producer.calls
    args_a, _, embed_a = json.loads(body_a)
    assert args_a == [a] and embed_a["chain"][0]["args"] == [a] and b not in body_a
    assert (kw_a["headers"]["id"], kw_b["headers"]["id"]) == (f"{a}.text", f"{b}.text")
    assert kw_b["correlation_id"] == f"{b}.text" and kw_b["headers"]["argsrepr"] == repr((b,))
    assert [q.name for q in kw_a["declare"]] == ["text"] and kw_b["declare"] == []


def test_the_bytes_in_redis_are_the_same(settings, broker) -> None:
    app = create_celery(settings, set_as_current=False)
    jid = str(uuid.uuid4())

    def sent() -> dict[str, Any]:
        [key] = broker.keys("text*")
        [raw] = broker.lrange(key, 0, -1)
        broker.delete(key)
        message = json.loads(raw)
        message["properties"].pop("delivery_tag")  # kombu's, one per message
        return message

    with app.producer_or_acquire() as producer:
        publish._send_stages(app, jid, "video", "normal", "text", producer)
    direct = sent()
    publish.publish_job(app, jid, "video", "normal")
    assert sent() == direct
    assert json.loads(base64.b64decode(direct["body"]))[0] == [jid]
