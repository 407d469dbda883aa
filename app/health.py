"""Liveness (the process answers) and readiness (the database and the broker answer)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import Any, Literal

from flask import Blueprint, Response, jsonify
from sqlalchemy import text

from app.errors import ServiceUnavailable
from app.services import services
from models.resource import Resource

log = logging.getLogger("genqueue.api")
bp = Blueprint("health", __name__, url_prefix="/v1")

BROKER_TIMEOUT_S = 2.0  # a readiness probe must answer well inside the orchestrator's timeout


class Health(Resource):
    status: Literal["ok"]


class Ready(Resource):
    status: Literal["ready"]
    checks: dict[str, dict[str, Any]]


@bp.get("/health")
def health() -> Response:
    """Liveness: touches nothing, so a database outage never gets the process restarted."""
    return jsonify(Health(status="ok").public())


def _check_database() -> None:
    with services().engine.connect() as conn:
        conn.execute(text("SELECT 1"))


def _check_broker() -> None:
    # A fresh connection, not the publisher pool: a pooled one may look alive and not be.
    with services().celery.connection_for_write() as conn:
        # The stubs say int; kombu compares it with elapsed seconds, which a float does too.
        conn.ensure_connection(max_retries=0, timeout=BROKER_TIMEOUT_S)  # type: ignore[arg-type]


def _probe(check: Callable[[], None]) -> dict[str, Any]:
    started = time.perf_counter()
    try:
        check()
    except Exception as exc:
        log.warning("readiness check %s failed: %s: %s", check.__name__, type(exc).__name__, exc)
        # The exception class only: messages can carry hosts, paths or credentials.
        return {"status": "fail", "error": type(exc).__name__}
    return {"status": "ok", "latency_ms": round((time.perf_counter() - started) * 1000, 1)}


@bp.get("/ready")
def ready() -> Response:
    """Readiness: 200 when a job submitted now would be recorded and queued."""
    checks = {"database": _probe(_check_database), "broker": _probe(_check_broker)}
    failed = [name for name, result in checks.items() if result["status"] != "ok"]
    if failed:
        raise ServiceUnavailable(
            f"Not ready: {', '.join(failed)} unavailable.", extra={"checks": checks}, reason="not_ready"
        )
    return jsonify(Ready(status="ready", checks=checks).public())
