"""Genqueue workers: the Celery app factory, pipeline tasks, webhooks and maintenance."""
