"""The models' threads below the event loop in CPU priority (`[server] worker_nice`, off by default).

Why: where cores are short, the event loop, a batch model's preparing thread, its executor thread and
PyTorch's threads under it all want the CPU at once, and the kernel shares it evenly: the loop then waits
its turn behind image decoding or a forward pass, and so does every answer, admission and health check
it would run. With the models' threads some nice levels lower the kernel runs the loop first, and the
model takes what the loop leaves. Measured on 2 cores under a flood of 4 MB images
(`benchmarks/results/worker_nice.md`): `/healthz` p99 ~10 against ~20 ms at 10 levels, as many images
answered; then the preparing thread was what mattered (the executor's alone: no change), but once
page faults no longer held the GIL (`process_settings`) the executor's counted too: raw bodies 6.2 against
9.8 ms with the image backend's executor 10 levels down (`image_flood_memory_parts.md`). The cost: those
threads also yield to every other process at the default priority (S9's load generator on the same
cores: 5-10% less throughput at 400 clients), hence off unless asked; except for a backend that asks
for it (`prepare_nice` for its preparing threads, `execute_nice` for its executor thread once built: the
image backend's decoding and, on the CPU, its forward, 10 levels by default). Levels count from the event
loop's thread, so asking again lowers a thread further, never back up.

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
    """Run the calling thread at least `nice` levels below the event loop's (the main thread's) CPU
    priority, at most at the lowest; a thread already that low stays as it is, so calling it again with
    a larger figure lowers it further and never raises it. 0, a platform without per-thread priorities,
    or a refusal (logged): it runs as it was."""
    if nice <= 0 or not hasattr(os, "setpriority"):
        return
    thread = threading.get_native_id()
    try:
        loop_level = os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id or thread)
        wanted = min(LOWEST, loop_level + nice)
        if os.getpriority(os.PRIO_PROCESS, thread) < wanted:
            os.setpriority(os.PRIO_PROCESS, thread, wanted)
    except OSError as exc:  # (e.g. a sandbox that forbids it)
        log.warning("could not lower thread %s's CPU priority by %d: %s", threading.current_thread().name, nice, exc)
