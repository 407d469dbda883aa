"""Maps a configured model name or local path to an adapter; one loaded instance per process."""

from __future__ import annotations

import gc
import importlib
import inspect
import logging
import os
import sys
import threading
import time
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

_loaded: dict[tuple[str, str, str], Generator] = {}
_lock = threading.Lock()


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
def get_generator(kind: Literal["text"], spec: str, dtype: str = ...) -> TextGenerator: ...
@overload
def get_generator(kind: Literal["video"], spec: str, dtype: str = ...) -> VideoGenerator: ...
@overload
def get_generator(kind: Literal["image"], spec: str, dtype: str = ...) -> ImageGenerator: ...
@overload
def get_generator(
    kind: str, spec: str, dtype: str = ...
) -> TextGenerator | VideoGenerator | ImageGenerator: ...
def get_generator(kind: str, spec: str, dtype: str = "auto") -> Generator:
    """Return the process-wide loaded adapter for (kind, spec, dtype), loading and warming it once."""
    key = (kind, spec, dtype)
    with _lock:
        gen = _loaded.get(key)
        if gen is None:
            gen = _resolve(kind, spec, dtype)()
            log.info("loading %s model %s", kind, spec)
            started = time.monotonic()
            gen.load()
            metrics().model_load.labels(kind).observe(time.monotonic() - started)
            _loaded[key] = gen
            log.info("%s model %s ready on %s", kind, spec, gen.device)
            if str(gen.device).startswith("cuda"):
                from tasks.generators import gpu  # torch is loaded already: the model is on CUDA

                gpu.watch()
        return gen


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
