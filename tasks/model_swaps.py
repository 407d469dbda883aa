"""A worker's side of a hot swap (models.swaps): load the new weights beside the old, then unload the old."""

from __future__ import annotations

import logging
import os
import threading

from models import catalog
from models.settings import Settings
from models.swaps import Swaps
from tasks.contract.stages import spec_for
from tasks.generators import registry

log = logging.getLogger(__name__)

_views: dict[tuple[int, str], Swaps] = {}  # (pid, Redis URL): a forked child reads for itself
_applied: dict[tuple[int, str], str] = {}  # the model_swaps this process switched to last
_lock = threading.Lock()


def effective(settings: Settings) -> Settings:
    """`settings` with the swaps in effect, for one stage attempt (it keeps them to the end).

    The first attempt to see a swap switches this process: with the old weights loaded, it loads
    the new ones first (attempts meanwhile wait here, then run on the new), then unloads the old;
    a batch still running on them keeps them until it ends.
    """
    key = (os.getpid(), settings.ratelimit_storage_uri)
    with _lock:
        view = _views.get(key)
        if view is None:
            view = _views[key] = Swaps(settings.ratelimit_storage_uri)
    now = view.effective(settings)
    if now.model_swaps == _applied.get(key, settings.model_swaps):
        return now
    with _lock:
        before = _applied.get(key, settings.model_swaps)
        if now.model_swaps != before:
            _switch(settings.model_copy(update={"model_swaps": before}), now)
            _applied[key] = now.model_swaps
    return now


def _switch(old: Settings, new: Settings) -> None:
    was = {(m.stage, m.id): m.spec for m in catalog.configured(old)}
    still = {(m.stage, m.spec) for m in catalog.configured(new)}
    loaded = {(kind, spec) for kind, spec, _ in registry.loaded()}
    for m in catalog.configured(new):
        before = was.get((m.stage, m.id))
        if before is None or before == m.spec or (m.stage, before) not in loaded:
            continue  # not swapped, or nothing of the old loaded here: the next job loads the new
        log.info("swapping %s model %s: %s -> %s", m.stage, m.id, before, m.spec)
        registry.get_generator(m.stage, m.spec, spec_for(new, m.stage).dtype, new.worker_max_models)
        if (m.stage, before) not in still:  # no other id still runs the old weights
            registry.unload(m.stage, before)
