"""GPU gauges of the worker's metrics: torch allocator memory and NVML utilisation per device, sampled.

Started by the registry once a model lands on CUDA, in the process that owns the CUDA context
(the threads pool's main process, or a prefork child), so on CPU the gauges never exist and
are absent from the scrape rather than zero. A sampler thread rather than a collector: the
main process of a prefork worker serves the scrape but must never touch CUDA, so the child
writes its figures where the main process reads them (tasks.metrics_server).
"""

from __future__ import annotations

import logging
import threading

import torch

from tasks.metrics import GpuGauges, gpu_gauges

log = logging.getLogger(__name__)

SAMPLE_S = 5.0  # how stale a scrape's GPU figures may be

_lock = threading.Lock()
_started = False


def watch() -> bool:
    """Start sampling this process's CUDA devices (idempotent); False, and nothing, without CUDA."""
    global _started
    if not torch.cuda.is_available():
        return False
    with _lock:
        if not _started:
            sample()  # a first value at once: the scrape right after the model load has one
            threading.Thread(target=_loop, name="genqueue-gpu-metrics", daemon=True).start()
            _started = True
    return True


def _loop() -> None:
    stop = threading.Event()
    while not stop.wait(SAMPLE_S):
        try:
            sample()
        except Exception:  # a driver hiccup must not end the sampling (nor the worker)
            log.exception("GPU metrics sample failed")


def sample() -> None:
    """Set the gauges for every visible device."""
    gauges = gpu_gauges()
    for index in range(torch.cuda.device_count()):
        device = str(index)
        gauges.allocated.labels(device).set(torch.cuda.memory_allocated(index))
        gauges.reserved.labels(device).set(torch.cuda.memory_reserved(index))
        gauges.total.labels(device).set(torch.cuda.get_device_properties(index).total_memory)
        _utilization(gauges, index, device)


_nvml_missing = False


def _utilization(gauges: GpuGauges, index: int, device: str) -> None:
    """NVML's busy percent, when nvidia-ml-py is installed (torch asks it); else no sample."""
    global _nvml_missing
    if _nvml_missing:
        return
    try:
        busy = torch.cuda.utilization(index)
    except ModuleNotFoundError:  # pynvml (nvidia-ml-py) not installed: utilisation stays absent
        _nvml_missing = True
        return
    gauges.utilization.labels(device).set(busy)  # a label made before the value would show as 0
