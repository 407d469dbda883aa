"""The chain's next step sent through its template is the message Celery's tracer would send, byte
for byte, and it is sent once: the request's chain is emptied, or left whole where it is not sent."""

from __future__ import annotations

import json
import uuid
from typing import Any

import pytest
from celery import signature
from celery.signals import before_task_publish
from kombu.exceptions import OperationalError

from models.settings import Settings
from tasks import continuation
from tasks.celery_app import create_celery
from tasks.contract import names, publish
from tasks.contract.templates import PLACEHOLDER
from tests.test_templates import FakeProducer, _on_the_wire


class Request:
    """The parts of a task request the tracer and send_next read."""

    def __init__(self, chain: list[dict[str, Any]] | None, task_id: str, callbacks: Any = None) -> None:
        self.chain, self.id, self.root_id, self.callbacks = chain, task_id, task_id, callbacks


class Task:
    def __init__(self, app: Any, request: Request) -> None:
        self.app, self.request = app, request


def _text_message(app: Any, broker_url: str, jid: str, modality: str, priority: str) -> Request:
    """The text stage's request as a worker gets it: the published chain after the JSON round trip."""
    producer = FakeProducer(broker_url)
    publish._send_stages(app, jid, modality, priority, "text", producer)  # type: ignore[arg-type]
    [(body, _kwargs)] = producer.calls
    _args, _kwargs2, embed = json.loads(json.dumps(body))
    return Request(embed["chain"], names.stage_task_id(jid, "text"))


def _as_celery(app: Any, broker_url: str, request: Request) -> tuple[bytes, dict[str, Any]]:
    """What the tracer's _dispatch_callbacks_and_chain publishes for this request."""
    producer = FakeProducer(broker_url)
    chain = json.loads(json.dumps(request.chain))
    app.amqp._retry_publish(
        signature(chain[-1], app=app).apply_async, (None,), chain=chain[:-1],
        parent_id=request.id, root_id=request.root_id, priority=None, producer=producer,
    )  # fmt: skip
    [call] = producer.calls
    return _on_the_wire(*call)


@pytest.mark.parametrize("broker_url", ["redis://127.0.0.1:6379/0", "amqp://guest:guest@127.0.0.1:5672//"])
@pytest.mark.parametrize(
    ("modality", "priority"), [("video", "normal"), ("image", "high"), ("storyboard", "low")]
)
def test_the_next_step_is_what_celery_would_send(broker_url, modality, priority) -> None:
    app = create_celery(Settings(broker_url=broker_url), set_as_current=False)
    for _ in range(2):  # a new job each time: recorded on the first, reused on the second
        jid = str(uuid.uuid4())
        request = _text_message(app, broker_url, jid, modality, priority)
        want = _as_celery(app, broker_url, request)
        producer = FakeProducer(broker_url)
        assert continuation.send_next(Task(app, request), jid, producer) is True  # type: ignore[arg-type]
        [call] = producer.calls
        body, options = _on_the_wire(*call)
        assert body == want[0]
        assert jid in body.decode() and PLACEHOLDER not in body.decode()
        # The queue is declared on the first send of a shape only, as publish_jobs does.
        assert {k: v for k, v in options.items() if k != "declare"} == {
            k: v for k, v in want[1].items() if k != "declare"
        }
        assert request.chain is None  # the tracer sends nothing more


def _video_request(app: Any, jid: str) -> Request:
    return _text_message(app, "redis://127.0.0.1:6379/0", jid, "video", "normal")


def test_left_to_celery_where_a_template_would_differ() -> None:
    app = create_celery(Settings(broker_url="redis://127.0.0.1:6379/0"), set_as_current=False)
    jid = str(uuid.uuid4())
    cases = []
    mutable = _video_request(app, jid)
    mutable.chain[-1]["immutable"] = False  # the tracer would put the task's result in its args
    cases.append(mutable)
    foreign = _video_request(app, jid)
    foreign.id = foreign.root_id = str(uuid.uuid4())  # ids not the job's: no fixed shape
    cases.append(foreign)
    linked = _video_request(app, jid)
    linked.callbacks = [{"task": "x"}]
    cases.append(linked)
    cases.append(Request(None, names.stage_task_id(jid, "text")))  # the chain's last task
    for request in cases:
        chain = request.chain
        producer = FakeProducer("redis://127.0.0.1:6379/0")
        assert continuation.send_next(Task(app, request), jid, producer) is False  # type: ignore[arg-type]
        assert producer.calls == [] and request.chain is chain


def test_left_to_celery_when_a_publish_signal_listens() -> None:
    app = create_celery(Settings(broker_url="redis://127.0.0.1:6379/0"), set_as_current=False)
    jid = str(uuid.uuid4())
    request = _video_request(app, jid)

    def listener(**_kwargs: Any) -> None:
        pass

    before_task_publish.connect(listener, weak=False)
    try:
        producer = FakeProducer("redis://127.0.0.1:6379/0")
        assert continuation.send_next(Task(app, request), jid, producer) is False  # type: ignore[arg-type]
        assert producer.calls == [] and request.chain
    finally:
        before_task_publish.disconnect(listener)


def test_a_broker_error_leaves_the_chain_to_celery() -> None:
    app = create_celery(Settings(broker_url="redis://127.0.0.1:6379/0"), set_as_current=False)

    class Down(FakeProducer):
        def publish(self, body: Any, **kwargs: Any) -> None:
            raise OperationalError("broker down")

    jid = str(uuid.uuid4())
    request = _video_request(app, jid)
    chain = list(request.chain)
    producer = Down("redis://127.0.0.1:6379/0")
    assert continuation.send_next(Task(app, request), jid, producer) is False  # type: ignore[arg-type]
    assert request.chain == chain  # Celery's continuation sends it, with its own retries


def test_shapes_are_bounded(monkeypatch) -> None:
    app = create_celery(Settings(broker_url="redis://127.0.0.1:6379/0"), set_as_current=False)
    monkeypatch.setattr(continuation, "MAX_SHAPES", 1)
    sent = []
    for modality in ("video", "image"):  # two shapes; room for one
        jid = str(uuid.uuid4())
        request = (
            _video_request(app, jid)
            if modality == "video"
            else _text_message(app, "redis://127.0.0.1:6379/0", jid, modality, "normal")
        )
        producer = FakeProducer("redis://127.0.0.1:6379/0")
        sent.append(continuation.send_next(Task(app, request), jid, producer))  # type: ignore[arg-type]
    assert sent == [True, False]


def test_the_queue_is_declared_once_per_connection_until_it_reconnects() -> None:
    app = create_celery(Settings(broker_url="redis://127.0.0.1:6379/0"), set_as_current=False)
    producer = FakeProducer("redis://127.0.0.1:6379/0")

    def send() -> dict[str, Any]:
        jid = str(uuid.uuid4())
        assert continuation.send_next(Task(app, _video_request(app, jid)), jid, producer)  # type: ignore[arg-type]
        return producer.calls[-1][1]

    first, second = send(), send()
    assert [q.name for q in first["declare"]] == ["video"] and second["declare"] == []
    producer.connection.declared_entities.clear()  # what kombu does when it reconnects
    assert [q.name for q in send()["declare"]] == ["video"]


def test_left_to_celery_in_eager_mode() -> None:
    app = create_celery(Settings(broker_url="redis://127.0.0.1:6379/0"), set_as_current=False)
    jid = str(uuid.uuid4())
    request = _video_request(app, jid)
    app.conf.task_always_eager = True  # the tracer would run the next task in process
    producer = FakeProducer("redis://127.0.0.1:6379/0")
    assert continuation.send_next(Task(app, request), jid, producer) is False  # type: ignore[arg-type]
    assert producer.calls == [] and request.chain
