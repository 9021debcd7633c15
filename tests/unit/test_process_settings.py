"""`process_settings.py`: freed memory kept for the next buffers, measured in page faults."""

from __future__ import annotations

import platform
import subprocess
import sys

import pytest

from inferd.process_settings import keep_freed_memory

# Image-sized buffers (5.5 MB, each written whole), made and freed three times over: the page faults of
# the third time, against the pages written then.
_BUFFERS = """
import resource, sys
from inferd.process_settings import keep_freed_memory
kept = keep_freed_memory(int(sys.argv[1]))
size, count = 5_500_000, 20
for _ in range(2):
    buffers = [b"x" * size for _ in range(count)]
    del buffers
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
buffers = [b"x" * size for _ in range(count)]
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(kept, faults / (size * count / resource.getpagesize()))
"""


def _faults_per_page(mb: int) -> tuple[bool, float]:
    out = subprocess.run([sys.executable, "-c", _BUFFERS, str(mb)], capture_output=True, text=True, check=True).stdout
    kept, share = out.split()
    return kept == "True", float(share)


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="malloc's thresholds are glibc's")
def test_kept_memory_serves_the_next_buffers_without_page_faults():
    kept, share = _faults_per_page(512)
    assert kept and share < 0.05, share
    # glibc's own policy hands the freed 110 MB back and faults them in again: what the setting avoids.
    kept, share = _faults_per_page(0)
    assert not kept and share > 0.5, share


def test_nothing_is_set_at_zero():
    assert keep_freed_memory(0) is False
