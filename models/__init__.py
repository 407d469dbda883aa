"""Genqueue data layer: typed ORM, job state machine, public job resource (no Flask, Celery, torch)."""

from models.base import Base
from models.job import Job, JobEvent, JobStatus, Modality, Priority, Stage
from models.tenant import ApiKey, Tenant

__all__ = ["ApiKey", "Base", "Job", "JobEvent", "JobStatus", "Modality", "Priority", "Stage", "Tenant"]
