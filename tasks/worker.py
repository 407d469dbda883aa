"""Entry point for `celery -A tasks.worker ...`: the Celery app configured from the environment."""

from __future__ import annotations

from models.settings import from_environment
from tasks import lifecycle
from tasks.celery_app import create_celery

# The Celery CLI needs a module-level app; building it connects to nothing.
celery = create_celery(from_environment())
lifecycle.connect(celery)
