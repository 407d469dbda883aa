"""Client test fixtures: the production web server and a real worker shared by a module."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from tests.support.client import Recorder, start_web
from tests.support.workers import thread_workers


@pytest.fixture(scope="module")
def web(settings, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The production web server for the module; each test's `sessions` empties its tables."""
    with start_web(settings, tmp_path_factory) as base:
        yield base


@pytest.fixture(scope="module")
def module_worker(settings) -> Iterator[Any]:
    """One real worker (threads pool, every queue) for the module; no test flushes the broker
    under it (the `broker` fixture would drop its queue bindings)."""
    with thread_workers(settings) as app:
        yield app


@pytest.fixture
def recorder() -> Recorder:
    return Recorder()
