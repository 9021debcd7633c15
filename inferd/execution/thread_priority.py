"""The models' threads below the event loop in CPU priority (`[server] worker_nice`, off by default).

Why: where cores are short, the event loop, a batch model's preparing thread, its executor thread and
PyTorch's threads under it all want the CPU at once, and the kernel shares it evenly: the loop then waits
its turn behind image decoding or a forward pass, and so does every answer, admission and health check
it would run. With the models' threads some nice levels lower the kernel runs the loop first, and the
model takes what the loop leaves. Measured on 2 cores under a flood of 4 MB images
(`benchmarks/results/worker_nice.md`): `/healthz` p99 ~10 against ~20 ms at 10 levels, as many images
answered; the preparing thread is what matters (the executor's alone: no change). The cost: those
threads also yield to every other process at the default priority (S9's load generator on the same
cores: 5-10% less throughput at 400 clients), hence off unless asked; except for a backend that asks
for it (`prepare_nice`: the image backend's decoding threads, 10 levels by default).

A Linux thread has a nice value of its own, and threads it starts inherit it (PyTorch's intra-op pool is
started by the thread that first computes). Lowering needs no privilege; nothing here ever raises one.
"""

from __future__ import annotations

import logging
import os
import threading

log = logging.getLogger("inferd.execution")
LOWEST = 19  # (Linux's nice range ends there)


def lower_this_thread(nice: int) -> None:
    """Lower the calling thread's CPU priority by `nice` levels (at most to the lowest). 0, a platform
    without per-thread priorities, or a refusal (logged): it runs as it was."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    thread = threading.get_native_id()
    try:
        os.setpriority(os.PRIO_PROCESS, thread, min(LOWEST, os.getpriority(os.PRIO_PROCESS, thread) + nice))
    except OSError as exc:  # (e.g. a sandbox that forbids it)
        log.warning("could not lower thread %s's CPU priority by %d: %s", threading.current_thread().name, nice, exc)
