"""Genqueue data layer: typed ORM, job state machine, public job resource (no Flask, Celery, torch).

The ORM names load on first use (a module `__getattr__`), together with every table module, so
that a light module of this package (models.logs, models.redaction, models.settings) can be
imported without SQLAlchemy: gunicorn's arbiter loads the log configuration before it forks and
before gevent patches the worker (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the checker sees the real names; at run time __getattr__ loads them
    from models.base import Base
    from models.idempotency import IdempotencyKey
    from models.job import Job, JobEvent, JobStatus, Modality, Priority, Stage
    from models.tenant import ApiKey, Tenant

__all__ = [
    "ApiKey", "Base", "IdempotencyKey", "Job", "JobEvent", "JobStatus", "Modality", "Priority", "Stage",
    "Tenant",
]  # fmt: skip

# Where each name is defined; the webhook module is loaded with them, as it registers its tables.
_HOMES = {
    "Base": "models.base", "IdempotencyKey": "models.idempotency", "Job": "models.job",
    "JobEvent": "models.job", "JobStatus": "models.job", "Modality": "models.job",
    "Priority": "models.job", "Stage": "models.job", "ApiKey": "models.tenant", "Tenant": "models.tenant",
}  # fmt: skip
_TABLES = (
    "models.base", "models.tenant", "models.job", "models.job_shots", "models.idempotency", "models.webhook",
)  # fmt: skip


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:  # a submodule (`from models import states`) is found by the import system
        raise AttributeError(f"module 'models' has no attribute {name!r}")
    for table_module in _TABLES:  # every table registered on Base.metadata, as an eager import did
        importlib.import_module(table_module)
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value
