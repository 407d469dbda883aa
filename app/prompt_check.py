"""Submit-time check of the text model's prompt limit, counted as the worker will count it, without torch."""

from __future__ import annotations

import _thread
import logging
import os
import time
from collections.abc import Callable

from tasks.contract.prompt_limit import MAX_PROMPT_TOKENS, SYSTEM_PROMPT, PromptCounter, counter_for

log = logging.getLogger("genqueue.api")
LOAD_WAIT_S = 30.0  # the first build from the GGUF takes seconds; later processes read a cache file
TEMPLATE_BYTES = 512  # room for a chat template's own markup around the system prompt and the prompt


class PromptCheck:
    """Loads the text model's tokenizer in the background once per process; then counts prompts.

    Until it is loaded, or when it cannot be (echo, a custom adapter, missing files), prompts are
    accepted: the adapter enforces the same limit when it runs, so none is wrongly refused here.
    """

    def __init__(self, text_model: str) -> None:
        self._text_model = text_model
        self._counter: PromptCounter | None = None
        self._start()

    def _start(self) -> None:
        # A forked child (a preloading server) inherits no thread: it loads its own.
        self._pid, self._ready, self._counter = os.getpid(), False, None
        _native_thread(self._load)

    def _load(self) -> None:
        try:
            self._counter = counter_for(self._text_model)
        except Exception as exc:  # a broken install must not break submits: the worker still checks
            log.warning("prompt token limit not checked at submit (%s): %s", self._text_model, exc)
        finally:
            self._ready = True

    def error(self, prompt: str) -> str | None:
        """Why the text model will refuse this prompt, or None."""
        if self._pid != os.getpid():
            self._start()
        quick = len(prompt.encode("utf-8")) + len(SYSTEM_PROMPT.encode("utf-8")) + TEMPLATE_BYTES
        if quick <= MAX_PROMPT_TOKENS and not self._ready:
            return None  # fits while the tokenizer loads: BPE and byte fallback make <= 1 token per byte
        if not self._wait_ready() or self._counter is None:
            return None
        tokens = self._counter.too_long(prompt)
        if tokens is None:
            return None
        return f"is {tokens} tokens for the text model; the limit is {self._counter.limit}"

    def _wait_ready(self) -> bool:
        # Polled, not an Event: the loader is a native thread, and under gevent an Event set from
        # another OS thread does not wake a waiting greenlet. time.sleep yields under gevent.
        deadline = time.monotonic() + LOAD_WAIT_S
        while not self._ready and time.monotonic() < deadline:
            time.sleep(0.05)
        return self._ready


def _native_thread(target: Callable[[], None]) -> None:
    """Run `target` on an OS thread even in a gevent-patched web worker.

    Building the tokenizer is seconds of CPU; on a greenlet it would stall every connection of
    the process for that long. A native thread shares the GIL instead, so requests keep flowing.
    """
    start = _thread.start_new_thread
    try:
        from gevent import monkey

        start = monkey.get_original("_thread", "start_new_thread")
    except ImportError:  # pragma: no cover - gevent is a dependency; plain threads need nothing
        pass
    start(target, ())
