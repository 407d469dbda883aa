"""A job's stage message built by Celery once per shape, then sent for each job with its id put in.

Every job's first message differs from another job's of the same modality, priority and entry
stage only in the job id: its task ids (names.stage_task_id), args, argsrepr, the chain's and the
errback's args. So Celery builds the message once (send_task, recorded instead of sent), kombu's
JSON of the body is kept with a placeholder id, and each job's publish is a string replace and
kombu's Producer.publish with the recorded arguments: what send_task would have published,
byte for byte (tests/test_templates.py compares the two), at a fraction of the CPU (Celery's
routing, message construction and the body's JSON were most of a submit's publishing).
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from celery import Celery
from kombu import Producer
from kombu.serialization import dumps

# A job id no job has (uuid4 ids carry version 4; this one says version 0).
PLACEHOLDER = "00000000-0000-0000-0000-00000000feed"
Key = tuple[Any, ...]


def _swap(value: Any, jid: str) -> Any:
    """`value` with the placeholder replaced by `jid` in every string it holds."""
    if isinstance(value, str):
        return value.replace(PLACEHOLDER, jid) if PLACEHOLDER in value else value
    if isinstance(value, dict):
        return {k: _swap(v, jid) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_swap(v, jid) for v in value)
    return value


class _Recorder:
    """A producer that records what send_task asks it to publish and sends nothing."""

    def __init__(self, producer: Producer) -> None:
        self._producer = producer
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._producer, name)  # the connection: send_task enters its error context

    def publish(self, body: Any, **kwargs: Any) -> None:
        self.calls.append((body, kwargs))


@dataclass(frozen=True, eq=False)  # hashed by identity: a connection's declared set holds it
class Template:
    """One recorded message: the body's JSON and publish's arguments, with the placeholder id."""

    body: str
    options: dict[str, Any]
    with_id: tuple[str, ...]  # the options holding the placeholder (headers, correlation_id, argsrepr)
    headers_with_id: tuple[str, ...]  # the headers holding it as strings (id, root_id, argsrepr), or ()

    def publish(self, app: Celery, producer: Producer, job_id: str, declare: bool | None = None) -> None:
        """Send the message with `job_id` put in. `declare` None: the queue is declared on the
        producer's connection's first send of this template only (kombu's own check copies the
        queue on every publish); the mark lives in kombu's set of the connection's declared
        entities, which kombu empties when it reconnects."""
        connection = producer.connection
        found = connection.declared_entities if connection is not None else None
        declared: set[Any] = set() if found is None else found  # an empty set is the connection's too
        if declare is None:
            declare = self not in declared
        options = dict(self.options)
        for name in self.with_id:
            if name == "headers" and self.headers_with_id:  # a walk of every header cost a sixth
                headers = options[name] = dict(options[name])
                for header in self.headers_with_id:
                    headers[header] = headers[header].replace(PLACEHOLDER, job_id)
            else:
                options[name] = _swap(options[name], job_id)
        options["reply_to"] = app.thread_oid  # what send_task sets: this thread's id (results are ignored)
        if not declare:
            options["declare"] = []
        producer.publish(self.body.replace(PLACEHOLDER, job_id), **options)
        if declare:
            declared.add(self)


def record(producer: Producer, send: Callable[[Producer, str], None]) -> Template:
    """The message `send(producer, PLACEHOLDER)` publishes through send_task, as a Template."""
    recorder = _Recorder(producer)
    send(recorder, PLACEHOLDER)  # type: ignore[arg-type]  # a stand-in with publish() and the rest
    [(body, kwargs)] = recorder.calls
    options = dict(kwargs)
    content_type, content_encoding, payload = dumps(body, serializer=options.pop("serializer"))
    options.update(content_type=content_type, content_encoding=content_encoding)
    text = payload if isinstance(payload, str) else payload.decode(content_encoding)
    with_id = tuple(name for name, value in options.items() if _swap(value, "") != value)
    headers: dict[str, Any] = options.get("headers") or {}
    in_headers = tuple(name for name, value in headers.items() if _swap(value, "") != value)
    if not all(isinstance(headers[name], str) for name in in_headers):
        in_headers = ()  # the id nested deeper (another Celery's layout): the headers are walked whole
    return Template(text, options, with_id, in_headers)


class Templates:
    """The templates of one Celery app, by shape, built on first use."""

    def __init__(self, app: Celery) -> None:
        self._by_key: dict[Key, Template] = {}
        self._lock = threading.Lock()
        # With task-sent events on, send_task publishes an event beside each message: not recorded.
        self.usable = not app.conf.task_send_sent_event

    def has(self, key: Key) -> bool:
        return key in self._by_key

    def __len__(self) -> int:
        return len(self._by_key)

    def get(self, key: Key, producer: Producer, send: Callable[[Producer, str], None]) -> Template:
        found = self._by_key.get(key)
        if found is None:
            found = record(producer, send)
            with self._lock:
                self._by_key.setdefault(key, found)
        return found


_APPS: weakref.WeakKeyDictionary[Celery, Templates] = weakref.WeakKeyDictionary()


def templates(app: Celery) -> Templates:
    """The app's templates (one set per app: another app may route or prioritise differently; an
    app's broker, routes and priorities are fixed when it is created, tasks.config)."""
    found = _APPS.get(app)
    if found is None:
        found = _APPS.setdefault(app, Templates(app))
    return found
