"""Maps a configured model name or local path to an adapter; one loaded instance per process."""

from __future__ import annotations

import gc
import importlib
import inspect
import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

# name -> "module:Class"; the module is imported only when that model is asked for, so the
# web process and zero-cost test workers never import torch.
_TEXT: dict[str, str] = {
    "smollm2": "tasks.generators.smollm2:SmolLM2Generator",
    "echo": "tasks.generators.echo:EchoTextGenerator",
}
_VIDEO: dict[str, str] = {
    "wan-tiny": "tasks.generators.wan:TinyWanGenerator",
    "echo": "tasks.generators.echo:EchoVideoGenerator",
}
# A local directory selects the generic adapter of its kind.
_TEXT_DIR = "tasks.generators.hf_causal:CausalLMGenerator"
_VIDEO_DIR = "tasks.generators.diffusers_video:DiffusersVideoGenerator"

_loaded: dict[tuple[str, str, str], Any] = {}
_lock = threading.Lock()


def register(kind: str, name: str, target: str) -> None:
    """Register an adapter class ("module:Class") under a name for `kind` text|video."""
    (_TEXT if kind == "text" else _VIDEO)[name] = target


def _resolve(kind: str, spec: str, dtype: str = "auto") -> Callable[..., Any]:
    table, dir_target = (_TEXT, _TEXT_DIR) if kind == "text" else (_VIDEO, _VIDEO_DIR)
    args: tuple[str, ...]
    if spec in table:
        target, args = table[spec], ()
    elif os.path.isdir(spec):
        target, args = dir_target, (spec,)
    elif ":" in spec and not os.path.exists(spec):
        target, args = spec, ()
    else:
        raise ValueError(f"unknown {kind} model {spec!r}: not a registered name or a local directory")
    module, _, attr = target.partition(":")
    cls = getattr(importlib.import_module(module), attr)
    # Only torch adapters take a dtype; echo and custom adapters need not know about it.
    kwargs = {"dtype": dtype} if dtype != "auto" and "dtype" in inspect.signature(cls).parameters else {}
    return lambda: cls(*args, **kwargs)


def get_generator(kind: str, spec: str, dtype: str = "auto") -> Any:
    """Return the process-wide loaded adapter for (kind, spec, dtype), loading and warming it once."""
    key = (kind, spec, dtype)
    with _lock:
        gen = _loaded.get(key)
        if gen is None:
            gen = _resolve(kind, spec, dtype)()
            log.info("loading %s model %s", kind, spec)
            gen.load()
            _loaded[key] = gen
            log.info("%s model %s ready on %s", kind, spec, getattr(gen, "device", "?"))
        return gen


def loaded() -> dict[tuple[str, str, str], Any]:
    """The adapters loaded in this process (for readiness reporting)."""
    return dict(_loaded)


def release_memory() -> None:
    """After an out-of-memory error or a soft time limit: drop garbage and cached device memory."""
    gc.collect()
    if "torch" in sys.modules:  # an echo-only worker never imports torch just to free nothing
        from tasks.generators.device import free_memory

        free_memory()
