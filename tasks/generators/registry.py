"""Maps a model name or local path to an adapter; the loaded instances of a process, a few per stage (LRU)."""

from __future__ import annotations

import gc
import importlib
import inspect
import logging
import os
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import Literal, overload

from models import catalog
from tasks.generators.base import Generator, ImageGenerator, TextGenerator, VideoGenerator
from tasks.metrics import metrics

log = logging.getLogger(__name__)

# The contract each stage's adapters implement; get_generator checks it, so a wrong class fails at
# load with a clear message instead of mid-job with an AttributeError.
_BASES: dict[str, type[Generator]] = {"text": TextGenerator, "video": VideoGenerator, "image": ImageGenerator}

# Names registered at run time (plugins, tests) on top of models.catalog's built-ins.
_extra: dict[tuple[str, str], str] = {}

# Least recently used first: get_generator moves a hit to the end and unloads from the front.
_loaded: OrderedDict[tuple[str, str, str], Generator] = OrderedDict()
_lock = threading.Lock()
_listeners: list[Callable[[], None]] = []  # told after a load or an unload (tasks.model_presence)


def register(kind: str, name: str, target: str) -> None:
    """Register an adapter class ("module:Class") under a name for `kind` text|video|image."""
    _base(kind)
    _extra[(kind, name)] = target


def _base(kind: str) -> type[Generator]:
    try:
        return _BASES[kind]
    except KeyError:
        raise ValueError(f"unknown stage {kind!r}; expected one of {', '.join(_BASES)}") from None


def _target(kind: str, spec: str) -> tuple[str, tuple[str, ...]]:
    """("module:Class", constructor args) for `spec`: a registered name, a folder or a "module:Class"."""
    if (kind, spec) in _extra:
        return _extra[(kind, spec)], ()
    known = catalog.entry(kind, spec)
    if known is not None:
        return known.adapter, ()
    if os.path.isdir(spec):
        return catalog.FOLDER_ADAPTERS[kind], (spec,)
    if ":" in spec and not os.path.exists(spec):
        return spec, ()
    raise ValueError(f"unknown {kind} model {spec!r}: not a registered name or a local directory")


def _resolve(kind: str, spec: str, dtype: str = "auto") -> Callable[[], Generator]:
    base = _base(kind)
    target, args = _target(kind, spec)
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, base)):
        raise TypeError(f"{target} is not a {base.__name__} (tasks/generators/base.py): cannot serve {kind}")
    # Only torch adapters take a dtype; echo and custom adapters need not know about it.
    kwargs = {"dtype": dtype} if dtype != "auto" and "dtype" in inspect.signature(cls).parameters else {}
    return lambda: cls(*args, **kwargs)


@overload
def get_generator(
    kind: Literal["text"], spec: str, dtype: str = ..., keep: int | None = ...
) -> TextGenerator: ...
@overload
def get_generator(
    kind: Literal["video"], spec: str, dtype: str = ..., keep: int | None = ...
) -> VideoGenerator: ...
@overload
def get_generator(
    kind: Literal["image"], spec: str, dtype: str = ..., keep: int | None = ...
) -> ImageGenerator: ...
@overload
def get_generator(
    kind: str, spec: str, dtype: str = ..., keep: int | None = ...
) -> TextGenerator | VideoGenerator | ImageGenerator: ...
def get_generator(kind: str, spec: str, dtype: str = "auto", keep: int | None = None) -> Generator:
    """Return the process-wide loaded adapter for (kind, spec, dtype), loading and warming it once.

    `keep` (Settings.worker_max_models): how many models of `kind` stay loaded; loading one more
    unloads the least recently used. A batch still running on an unloaded one keeps its own
    reference and finishes; its memory goes when that batch does.
    """
    key = (kind, spec, dtype)
    evicted: list[Generator] = []
    with _lock:
        gen = _loaded.get(key)
        if gen is not None:
            _loaded.move_to_end(key)
            return gen
        gen = _resolve(kind, spec, dtype)()
        log.info("loading %s model %s", kind, spec)
        started = time.monotonic()
        gen.load()
        metrics().model_load.labels(kind).observe(time.monotonic() - started)
        _loaded[key] = gen
        log.info("%s model %s ready on %s", kind, spec, gen.device)
        same_kind = [k for k in _loaded if k[0] == kind]
        for old in same_kind[: max(0, len(same_kind) - keep)] if keep else ():
            evicted.append(_loaded.pop(old))
            log.info("unloading %s model %s (more than %d loaded)", kind, old[1], keep)
    if str(gen.device).startswith("cuda"):
        from tasks.generators import gpu  # torch is loaded already: the model is on CUDA

        gpu.watch()
    if evicted:
        del evicted
        release_memory()
    _changed()
    return gen


def unload(kind: str, spec: str) -> bool:
    """Unload `spec` of `kind` (every dtype) now; a batch running on it keeps it until it ends."""
    with _lock:
        gone = [_loaded.pop(k) for k in [k for k in _loaded if k[:2] == (kind, spec)]]
    if not gone:
        return False
    log.info("unloaded %s model %s", kind, spec)
    del gone
    release_memory()
    _changed()
    return True


def on_change(listener: Callable[[], None]) -> None:
    """Call `listener()` after each load and unload in this process (idempotent per listener)."""
    if listener not in _listeners:
        _listeners.append(listener)


def _changed() -> None:
    for listener in list(_listeners):
        try:
            listener()
        except Exception:  # reporting what is loaded must never fail a task
            log.warning("model change listener failed", exc_info=True)


def loaded() -> dict[tuple[str, str, str], Generator]:
    """The adapters loaded in this process (for readiness reporting)."""
    return dict(_loaded)


def side_multiple(spec: str, stage: str = "video") -> int:
    """What `stage` (video | image) sides must be multiples of for model `spec`: the loaded
    adapter's own rule when this process has it (a folder model learns its rule from the
    pipeline), else the catalog's."""
    for (kind, loaded_spec, _), gen in list(_loaded.items()):
        if kind == stage and loaded_spec == spec and isinstance(gen, VideoGenerator | ImageGenerator):
            return int(gen.spatial_multiple)
    return catalog.side_multiple(spec, stage)


def release_memory() -> None:
    """After an out-of-memory error or a soft time limit: drop garbage and cached device memory."""
    gc.collect()
    if "torch" in sys.modules:  # an echo-only worker never imports torch just to free nothing
        from tasks.generators.device import free_memory

        free_memory()
