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
    import huggingface_hub.utils.tqdm as hub_tqdm
    import transformers.utils.logging as transformers_logging

    hub_tqdm.disable_progress_bars()
    for library in (transformers_logging, diffusers_logging):
        library.disable_progress_bar()
        library.disable_default_handler()
        library.enable_propagation()
