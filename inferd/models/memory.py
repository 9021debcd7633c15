"""Will a model version fit? Checked before its workers are built, so a load that would not fit is
refused with a clear error instead of taking the running versions down with it.

The need is the backend's own figure (a `memory_bytes(options)` function beside its factory, e.g. the
weights' size for the PyTorch backend) times the workers on each kind of device; what is free is CUDA's
free memory on each device a worker would use, or the host's available memory (MemAvailable) for the
CPU. `memory_headroom_mb` stays free. A backend without a figure is assumed to need nothing. On CUDA
the version is checked again once built: one that left less than the headroom free is unloaded.
"""

from __future__ import annotations

import sys

from ..backends import module_memory_bytes
from ..config import ModelConfig
from ..errors import InsufficientMemory


def needed_bytes(config: ModelConfig) -> int:
    """One worker's need, as the backend estimates it (0 when it has no estimate)."""
    return module_memory_bytes(config.backend, config.options)


def check_fits(config: ModelConfig, headroom_bytes: int) -> None:
    """Raise InsufficientMemory when the version's workers would not fit beside what is loaded now."""
    per_worker = needed_bytes(config)
    if per_worker <= 0:
        return
    free_by_device: dict[str, int] = {}
    for device in config.worker_devices:
        where = _where(device)
        if where not in free_by_device:
            free_by_device[where] = _free_bytes(where)
        free_by_device[where] -= per_worker
    for where, left in free_by_device.items():
        if left < headroom_bytes:
            need = per_worker * sum(_where(d) == where for d in config.worker_devices)
            raise InsufficientMemory(
                f"model {config.name} version {config.version} needs about {need >> 20} MiB on {where}; "
                f"{(left + need) >> 20} MiB are free and {headroom_bytes >> 20} MiB must stay free")


def _where(device: str) -> str:
    """A worker's device as memory is counted: a CUDA device, or the host."""
    torch = sys.modules.get("torch")
    cuda = torch is not None and torch.cuda.is_available()
    if device.startswith("cuda"):
        return device if ":" in device else "cuda:0"
    if device.startswith("auto") and cuda and torch is not None:
        index = int(device.partition(":")[2] or 0) % torch.cuda.device_count()
        return f"cuda:{index}"
    return "host"


def _free_bytes(where: str) -> int:
    if where == "host":
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
        return 1 << 62  # (no figure: assume it fits)
    import torch

    free, _total = torch.cuda.mem_get_info(torch.device(where))
    return int(free)


def cuda_free_after_build(config: ModelConfig) -> int | None:
    """The least free CUDA memory on the version's devices now (after its workers built), or None when
    none of them is a CUDA device: the check after a build, where estimates meet what was allocated."""
    devices = {w for w in map(_where, config.worker_devices) if w != "host"}
    return min(_free_bytes(d) for d in devices) if devices else None
