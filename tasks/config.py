"""Workers' Celery configuration: delivery guarantees, limits, beat; queues and routes from the contract."""

from __future__ import annotations

from typing import Any

from models.job import Stage
from models.settings import Settings
from tasks.contract import names
from tasks.contract.routing import (
    MAX_PRIORITY,
    REDIS_PRIORITY,
    broker_priority,
    is_amqp,
    task_queues,
    task_routes,
)
from tasks.contract.stages import stage_specs


def celery_config(s: Settings) -> dict[str, Any]:
    amqp = is_amqp(s.broker_url)
    specs = stage_specs(s)
    transport: dict[str, Any] = {}
    if s.broker_url.startswith("redis"):
        # Unacked messages come back after the visibility timeout, even while still running,
        # so it must exceed the longest hard time limit plus the longest retry countdown.
        transport = {
            "visibility_timeout": s.broker_visibility_timeout_s,
            "priority_steps": sorted(set(REDIS_PRIORITY.values())),
            "queue_order_strategy": "priority",
            "socket_timeout": 5,
            "socket_connect_timeout": 3,
            # kombu sweeps for messages past the visibility timeout only every
            # interval * throttle seconds (100 s by default): one knob, no throttle.
            "unacked_restore_interval": s.broker_restore_interval_s,
            "unacked_restore_throttle": 1,
            # The restore scan's lock: a worker killed (or a Redis restarted) while holding it
            # would block every restore for kombu's default 300 s.
            "unacked_mutex_expire": 60,
        }
    elif amqp and s.broker_socket_timeout_s:
        # py-amqp sets these as SO_RCVTIMEO/SO_SNDTIMEO; on a consumer's connection a read that
        # times out raises socket.timeout, a connection error, so the worker reconnects. Without
        # them a sync call (basic_qos after a reconnect) on a stream that lost its framing waits
        # until the broker drops the connection for missed heartbeats (celery/py-amqp#330).
        transport = {
            "read_timeout": s.broker_socket_timeout_s,
            "write_timeout": s.broker_socket_timeout_s,
        }
    elif s.broker_url.startswith("memory"):
        transport = {"polling_interval": 0.01}  # in-process broker: poll fast, it costs nothing
    return {
        "broker_url": s.broker_url,
        "broker_transport_options": transport,
        "broker_connection_retry_on_startup": True,
        # A worker keeps reconnecting through a broker outage of any length (Celery's default
        # gives up after 100 tries and exits); `genqueue worker` restarts it if it exits anyway.
        "broker_connection_max_retries": None,
        # On a connection loss, tasks already running finish and commit; their acks are lost
        # and the redelivered copies are no-ops (stages are idempotent). Cancelling them
        # instead would throw away work. Said explicitly: Celery 6 changes the default.
        "worker_cancel_long_running_tasks_on_connection_loss": False,
        "broker_connection_timeout": 3,
        "broker_heartbeat": 30 if amqp else None,
        "task_ignore_result": True,  # outputs live in the database, not a result backend
        "result_backend": None,
        "task_serializer": "json",
        "accept_content": ["json"],
        # At-least-once: ack after the task ran, requeue when the pool child dies, one
        # message in hand at a time so priorities and long tasks don't starve siblings.
        "task_acks_late": True,
        # A worker publishing the next stage (or a retry) during a broker blip waits for the
        # broker (up to ~2 min) rather than failing a task whose work is done. The API passes
        # its own short policy (tasks.contract.publish) so clients get a quick 503 instead.
        "task_publish_retry_policy": {
            "max_retries": 60,
            "interval_start": 0,
            "interval_step": 0.5,
            "interval_max": 2,
        },
        "task_reject_on_worker_lost": True,
        "worker_prefetch_multiplier": 1,
        "task_queues": task_queues(s.broker_url),
        "task_default_queue": names.DEFAULT_QUEUE,
        "task_routes": task_routes(s),
        "task_queue_max_priority": MAX_PRIORITY,
        "task_default_priority": broker_priority("normal", s.broker_url),
        "task_annotations": {
            **{
                spec.task: {"soft_time_limit": spec.soft_time_limit_s, "time_limit": spec.time_limit_s}
                for spec in specs.values()
            },
            # A storyboard's shot is a video render: the video stage's limits.
            names.RENDER_SHOT: {
                "soft_time_limit": specs[Stage.VIDEO].soft_time_limit_s,
                "time_limit": specs[Stage.VIDEO].time_limit_s,
            },
            # A job's variants (tasks.variants): CPU work, bounded all the same.
            names.POSTPROCESS: {
                "soft_time_limit": s.variant_time_limit_s,
                "time_limit": s.variant_time_limit_s + 60,
            },
        },
        # Model loading in worker_process_init takes longer than the 4 s default allows.
        "worker_proc_alive_timeout": 600,
        "worker_send_task_events": s.worker_task_events,  # Flower turns them on when it runs
        # No task-sent event: one Redis PUBLISH less per message sent (every submit, every chain
        # link); Flower shows a task from "received" on instead of from "sent".
        "task_send_sent_event": False,
        "worker_hijack_root_logger": False,
        "include": [
            "tasks.pipeline",
            "tasks.storyboard",
            "tasks.maintenance",
            "tasks.retention",
            "tasks.webhooks",
            "tasks.variants",
        ],
        # celery beat: stuck jobs re-enqueued or failed, expired idempotency keys dropped, and
        # webhook messages a crash left unsent picked up again.
        "beat_schedule": {
            "reap-stuck-jobs": {
                "task": names.REAP_STUCK_JOBS,
                "schedule": s.reaper_interval_s,
                "options": {"expires": s.reaper_interval_s},
            },
            # Expired jobs' data removed in bounded batches (tasks.retention); one run at a time
            # is enough, a second one by accident takes other jobs.
            "expire-artifacts": {
                "task": names.EXPIRE_ARTIFACTS,
                "schedule": s.retention_interval_s,
                "options": {"expires": s.retention_interval_s},
            },
            # A backlog of relay ticks is worth one tick.
            "relay-webhooks": {
                "task": names.RELAY_WEBHOOKS,
                "schedule": s.webhook_relay_interval_s,
                "options": {"expires": s.webhook_relay_interval_s},
            },
        },
    }
