"""Webhook fixtures: a receiver, settings with a compressed schedule, an app and a real worker on them."""

from __future__ import annotations

from typing import Any

import pytest

from tests.support.api import authed_client_class
from tests.support.workers import in_process_worker
from tests.webhooks.helpers import hook_settings, serve


@pytest.fixture
def receiver(httpserver):
    with serve(httpserver) as rec:
        yield rec


@pytest.fixture
def overrides() -> dict[str, Any]:
    return {}  # a test parametrizes this to change webhook settings


@pytest.fixture
def hooks(settings, overrides):
    return hook_settings(settings, **overrides)


@pytest.fixture
def hook_client(hooks, sessions, broker, api_key):
    from app import create_app

    flask_app = create_app(hooks)
    flask_app.testing = True
    flask_app.test_client_class = authed_client_class(api_key)
    yield flask_app.test_client()
    flask_app.extensions["genqueue"].engine.dispose()


@pytest.fixture
def hook_worker(hooks, sessions, broker):
    """A real worker (threads pool) on every queue, webhooks included, with the webhook settings."""
    import tasks.webhooks  # noqa: F401  registers the delivery tasks
    from tasks.celery_app import create_celery

    app = create_celery(hooks, set_as_current=False)
    with in_process_worker(app):
        yield app
