"""Worker process lifecycle: models loaded once per process (after the fork), held messages recorded."""

from __future__ import annotations

import gc
import logging
import os
from collections.abc import Callable
from typing import Any

from celery import Celery
from celery.apps.worker import Worker as CliWorker
from celery.signals import worker_init, worker_process_init, worker_ready, worker_shutdown

from models.settings import Settings
from tasks import hang_guard, held_messages, metrics_server, model_presence
from tasks.celery_app import app_settings
from tasks.contract.stages import spec_for
from tasks.generators.registry import get_generator

log = logging.getLogger("genqueue.worker")


def preload_kinds(settings: Settings) -> list[str]:
    """The stages settings.worker_preload names, in order."""
    return [k for k in (k.strip() for k in settings.worker_preload.split(",")) if k]


def preload_models(settings: Settings, on_loaded: Callable[[str], None] | None = None) -> list[str]:
    """Load (and warm up) the models named in settings.worker_preload; returns what was loaded.

    `on_loaded(description)` after each one (the demo's loading indicator).
    """
    loaded = []
    if preload_kinds(settings):
        model_presence.start(settings)
    for kind in preload_kinds(settings):
        spec = spec_for(settings, kind)
        gen = get_generator(spec.stage, spec.model, spec.dtype, settings.worker_max_models)
        loaded.append(f"{kind}={spec.model}@{getattr(gen, 'device', '?')}")
        if on_loaded is not None:
            on_loaded(loaded[-1])
    return loaded


def _settings(app: Any) -> Settings:
    return app_settings(app)


def _on_worker_init(sender: Any = None, **_: Any) -> None:
    # Before the consumer starts, in the process that takes messages (any pool): a command-line
    # worker only, since `genqueue worker` is what puts a killed one's messages back.
    if isinstance(sender, CliWorker):
        held_messages.record(_settings(sender.app))


def _on_worker_shutdown(**_: Any) -> None:
    held_messages.stop_recording()  # a warm stop restored or acked everything it held


def _on_process_init(**_: Any) -> None:
    # Prefork child: the only safe place to touch CUDA. Never in the parent before the fork.
    from celery import current_app

    loaded = preload_models(_settings(current_app))
    gc.freeze()  # a prefork child: see _on_worker_ready
    log.info("genqueue worker process %d ready; models: %s", os.getpid(), ", ".join(loaded) or "lazy")


def _on_worker_ready(sender: Any = None, **_: Any) -> None:
    pool = getattr(getattr(sender, "controller", None), "pool_cls", "")
    name = pool if isinstance(pool, str) else getattr(pool, "__module__", "")
    if "prefork" in name:
        return  # children loaded their own models in worker_process_init
    cli = isinstance(getattr(sender, "controller", None), CliWorker)
    if cli:
        # The pool enforces no hard time limit; in-process workers (demo, tests) stay unarmed.
        hang_guard.arm(sender.controller)
    loaded = preload_models(_settings(sender.app))
    if cli:
        # The process's code, libraries and models stay for its life: out of the collector's sight
        # a full collection no longer walks them (in the web it was a fifth of a batch's CPU). Not
        # in-process workers: their process (a test run, the demo) keeps making garbage of its own.
        gc.freeze()
    log.info("genqueue worker %s ready; models: %s", sender.hostname, ", ".join(loaded) or "lazy")


def connect(app: Celery) -> None:
    """Hook the model loading and the metrics endpoint into the worker signals (idempotent)."""
    metrics_server.connect()
    worker_process_init.connect(_on_process_init, weak=False, dispatch_uid="genqueue-preload-child")
    worker_ready.connect(_on_worker_ready, weak=False, dispatch_uid="genqueue-preload-ready")
    worker_init.connect(_on_worker_init, weak=False, dispatch_uid="genqueue-held-record")
    worker_shutdown.connect(_on_worker_shutdown, weak=False, dispatch_uid="genqueue-held-stop")
