"""Genqueue data layer: typed ORM, job state machine, public job resource (no Flask, Celery, torch)."""

from models.base import Base
from models.idempotency import IdempotencyKey
from models.job import Job, JobEvent, JobStatus, Modality, Priority, Stage

__all__ = ["Base", "IdempotencyKey", "Job", "JobEvent", "JobStatus", "Modality", "Priority", "Stage"]
