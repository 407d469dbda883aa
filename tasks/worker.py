"""Entry point for `celery -A tasks.worker ...`: the Celery app configured from the environment."""

from __future__ import annotations

from models.settings import from_environment
from tasks import lifecycle, log_context
from tasks.celery_app import create_celery

# The Celery CLI needs a module-level app; building it connects to nothing.
settings = from_environment()
celery = create_celery(settings)
lifecycle.connect(celery)
log_context.connect_process_logging(celery, settings)  # worker and beat log through models.logs
