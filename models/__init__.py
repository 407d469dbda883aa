"""Genqueue data layer: typed ORM, job state machine, public job resource (no Flask, Celery, torch)."""

from models import webhook as _webhook  # noqa: F401  registers the webhook tables
from models.base import Base
from models.idempotency import IdempotencyKey
from models.job import Job, JobEvent, JobStatus, Modality, Priority, Stage
from models.tenant import ApiKey, Tenant

__all__ = [
    "ApiKey", "Base", "IdempotencyKey", "Job", "JobEvent", "JobStatus", "Modality", "Priority", "Stage",
    "Tenant",
]  # fmt: skip
