"""A finished stage's next chain step, sent through a recorded message template instead of Celery's canvas.

When a chained task returns, Celery's tracer pops the next signature off the message's chain and
publishes it through Signature.apply_async and send_task: routing, the message's construction,
the body's JSON, a queue declaration, the same for every job but its id. That was 14% of a
worker's busy samples in `python -m bench.pipeline`. Here the text stage sends that message
itself as it returns: recorded once per shape from Celery's own continuation with a placeholder
job id (tasks.contract.templates), sent with this job's id put in, and the request's chain then
emptied so the tracer does not send it again (tests/test_continuation.py compares the bytes).

Celery's path still runs wherever this one does not apply: a chain whose ids are not the job's
(no fixed shape), link callbacks, an argument-taking (mutable) next signature, inherited
priorities, publish signal receivers or sent events, eager mode, and any error on this one try
(the broker down, say): Celery then retries as its callback policy says and fails the task,
errbacks included, if it cannot, exactly as before. An error after the broker took the message
(a lost reply) can mean a second send, as Celery's own retry of it can; a duplicate stage
message finds the job's conditional transitions past it or renders the stage again, never
finishing the job twice.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from celery import Celery, Task, signature
from celery.signals import after_task_publish, before_task_publish, task_sent
from kombu import Producer

from tasks.contract.templates import PLACEHOLDER, Key, templates

log = logging.getLogger(__name__)

MAX_SHAPES = 64  # distinct chain shapes per process; past this, Celery's path (never unbounded memory)


def _applies(app: Celery, request: Any, job_id: str) -> bool:
    """Whether the next step is one a template reproduces (see the module's docstring)."""
    chain = request.chain
    if not chain or request.callbacks or not isinstance(chain[-1], dict):
        return False
    if not chain[-1].get("immutable") or app.conf.task_inherit_parent_priority:
        return False  # the tracer would put the task's result or priority into the message
    if app.conf.task_always_eager:
        return False  # the continuation would run the next task in process, not publish it
    if before_task_publish.receivers or after_task_publish.receivers or task_sent.receivers:
        return False  # send_task would run them beside the message
    if not templates(app).usable:
        return False  # send_task would send a task-sent event too
    return job_id in str(request.id) and job_id in str(request.root_id or request.id)


def send_next(task: Task[..., Any], job_id: str, producer: Producer | None = None) -> bool:
    """Publish the chain's next step as Celery's tracer would, then empty the request's chain.

    Call it as the task body returns normally, once (the tracer continues the chain only then).
    Returns whether it sent the message; when not, the chain is left for Celery's own path.
    `producer`: one already acquired (tests); None takes one from the app's pool.
    """
    app, request = task.app, task.request
    try:
        if not _applies(app, request, job_id):
            return False
        parent = str(request.id)
        root = str(request.root_id or parent)
        shape = json.dumps([request.chain, parent, root], separators=(",", ":")).replace(job_id, PLACEHOLDER)
        key: Key = ("continuation", shape)
        table = templates(app)
        if not table.has(key) and len(table) >= MAX_SHAPES:
            return False
        with app.producer_or_acquire(producer) as p:

            def send(recorder: Producer, _placeholder: str) -> None:
                _continue_as_celery(app, shape, recorder)

            template = table.get(key, p, send)
            with p.connection._reraise_as_library_errors():
                template.publish(app, p, job_id)  # its queue declared once per connection
            request.chain = None  # sent: the tracer must not send it again
    except Exception:  # a soft time limit landing here too: Celery's path sends it, once
        if request.chain is None:
            return True  # sent (the chain is emptied right after the publish returns)
        log.warning("job %s: next chain step left to Celery's own publish", job_id, exc_info=True)
        return False
    return True


def _continue_as_celery(app: Celery, shape: str, producer: Producer) -> None:
    """What the tracer's _dispatch_callbacks_and_chain does for a chain of this shape (the
    placeholder's), publishing through `producer`: the one definition of the message."""
    chain, parent, root = json.loads(shape)
    step = signature(chain[-1], app=app)
    # The tracer's own call (Celery 5.7, pinned; the stubs do not list it): a callback publish
    # (no retry of its own on this one try), the task's return value as the immutable
    # signature's ignored argument.
    app.amqp._retry_publish(  # type: ignore[attr-defined]
        step.apply_async, (None,), chain=chain[:-1], parent_id=parent, root_id=root, priority=None,
        producer=producer,
    )  # fmt: skip
