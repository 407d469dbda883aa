"""Queues, routes and broker priorities: where each task's messages go, for publishers and workers alike.

A publisher and a worker that disagree here lose messages (a route to a queue nobody consumes) or
fail to connect (RabbitMQ refuses a queue redeclared with other arguments), so both build their
Celery app from these (tasks.config). Torch-free and light, so app/ may import it.
"""

from __future__ import annotations

from typing import Any

from kombu import Queue

from models.settings import Settings
from tasks.contract import names
from tasks.contract.stages import stage_specs

# Job priority -> broker priority. Redis sorts 0 first; RabbitMQ delivers higher numbers first.
REDIS_PRIORITY = {"high": 0, "normal": 3, "low": 6}
AMQP_PRIORITY = {"high": 9, "normal": 5, "low": 1}
MAX_PRIORITY = 10  # x-max-priority of every queue on RabbitMQ


def is_amqp(broker_url: str) -> bool:
    return broker_url.startswith(("amqp", "pyamqp"))


def broker_priority(priority: str, broker_url: str) -> int:
    table = AMQP_PRIORITY if is_amqp(broker_url) else REDIS_PRIORITY
    return table.get(priority, table["normal"])


def task_queues(broker_url: str) -> list[Queue]:
    """Every queue, declared the same way by whoever declares it first."""
    queue_args = {"x-max-priority": MAX_PRIORITY} if is_amqp(broker_url) else None
    return [Queue(q, routing_key=q, queue_arguments=queue_args) for q in names.ALL_QUEUES]


def task_routes(settings: Settings) -> dict[str, dict[str, Any]]:
    """Task name -> queue: each stage to its own queue (stage specs), the rest to default or webhooks."""
    return {
        **{spec.task: {"queue": spec.queue} for spec in stage_specs(settings).values()},
        names.RENDER_SHOT: {"queue": names.VIDEO_QUEUE},  # a storyboard's shot renders as a video
        names.COMPENSATE: {"queue": names.DEFAULT_QUEUE},
        names.POSTPROCESS: {"queue": names.POST_QUEUE},
        names.DELIVER_WEBHOOK: {"queue": names.WEBHOOKS_QUEUE},
        names.RELAY_WEBHOOKS: {"queue": names.WEBHOOKS_QUEUE},
        names.REAP_STUCK_JOBS: {"queue": names.DEFAULT_QUEUE},
        names.EXPIRE_ARTIFACTS: {"queue": names.DEFAULT_QUEUE},
    }
