"""The model libraries' console output in a worker: no progress bars, their loggers through ours.

transformers, diffusers and huggingface_hub draw tqdm bars while loading weights (and diffusers
while denoising) and give their loggers a stderr handler of their own that does not propagate. In
a worker, Celery redirects stderr to a logger, so each bar refresh became a WARNING line; and the
libraries' own handler wrote plain text between the JSON lines.
"""

from __future__ import annotations

import functools


@functools.cache
def quiet_model_libraries() -> None:
    """Turn the progress bars off and route the libraries' log records to the root handler (once)."""
    import diffusers.utils.logging as diffusers_logging
    import transformers.utils.logging as transformers_logging

    # Exported by huggingface_hub.utils (its documented home), through a lazy __init__ mypy
    # reads as a private import.
    from huggingface_hub.utils import disable_progress_bars  # type: ignore[attr-defined]

    disable_progress_bars()
    for library in (transformers_logging, diffusers_logging):
        library.disable_progress_bar()
        library.disable_default_handler()
        library.enable_propagation()
