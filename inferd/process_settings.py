"""Process-wide settings made once before serving: the open-file limit raised (and the connections it
allows), freed memory kept for reuse (`[server] keep_freed_memory_mb`) rather than handed back to the
kernel, and what startup left alive hidden from the garbage collector.

Why keep freed memory: glibc's malloc gives each allocation over its threshold (128 KiB, moved up as
such blocks are freed) fresh pages from the kernel, and hands freed space at the top of the heap back
once more than twice that is free. A 4 MB image sent as JSON is 5.5 MB read, joined and lifted on the
event loop, then decoded into a 5.7 MB bitmap on a preparing thread: each of these buffers, made again
for every image, took a page fault per 4 KiB touched, taken holding the GIL (by the loop itself, or by
a thread below it in priority that the loop then waits for). Measured under S16's flood with only
this setting changed (`benchmarks/results/image_flood_memory_parts.md`): page faults per image 368
against 2,748, `/healthz` p99 with JSON bodies 11.3 against 19.5 ms.

Here blocks up to 32 MiB (glibc's largest threshold) come from the heap, and up to
`keep_freed_memory_mb` of freed heap stays mapped for the next ones: the process's resident memory can
stay up to that much (per malloc arena: the loop's, and those of busy threads) above what it uses after
a burst; after S16's JSON flood it was 682 MB against 673 with glibc's own policy. Only glibc has these
settings; with another C library, or at 0, the library's own policy stands.
"""

from __future__ import annotations

import ctypes
import gc
import logging
import platform
import resource

log = logging.getLogger("inferd.server")

M_TRIM_THRESHOLD = -1  # (glibc's malloc.h)
M_MMAP_THRESHOLD = -3
LARGEST_MMAP_THRESHOLD = 32 << 20  # glibc refuses more (half its thread arenas' heap size, 64-bit)


def keep_freed_memory(mb: int) -> bool:
    """Let glibc's malloc keep up to `mb` MiB of freed memory for reuse, and serve blocks up to 32 MiB
    from it; True when set (0, or a C library other than glibc: False, nothing changed)."""
    if mb <= 0 or platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    trim = min(mb << 20, 2**31 - 1)  # (an int in C)
    if not (mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD) and mallopt(M_TRIM_THRESHOLD, trim)):
        log.warning("could not set malloc's thresholds (keep_freed_memory_mb = %d): its defaults stand", mb)
        return False
    return True


def raise_open_file_limit() -> None:
    """Each client connection is a file descriptor; the usual soft limit of 1024 is too low for a server."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))


def freeze_survivors() -> None:
    """Once the models are loaded, hide everything alive then (modules, models, config) from the cyclic
    garbage collector: its collections scan only what requests allocate from then on. (With torch
    loaded that is ~400,000 objects, ~200 ms per full collection here.) No collection first: it would
    stall the loop just as the balancers start sending; what startup left unreachable stays, once."""
    gc.freeze()


def connection_budget() -> int:
    """Connections the process can hold: its file-descriptor limit, less 256 for its own files (model
    weights, the agent port, logs, the engine's sockets)."""
    return max(64, resource.getrlimit(resource.RLIMIT_NOFILE)[0] - 256)
