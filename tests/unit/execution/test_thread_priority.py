"""`execution/thread_priority.py`: a thread lowers its own CPU priority, and only its own."""

from __future__ import annotations

import os
import threading

from inferd.execution.thread_priority import LOWEST, lower_this_thread


def _in_a_thread(nice: int) -> tuple[int, int]:
    """(the nice value before, and after `lower_this_thread(nice)`) of a new thread."""
    seen: list[int] = []

    def run() -> None:
        me = threading.get_native_id()
        seen.append(os.getpriority(os.PRIO_PROCESS, me))
        lower_this_thread(nice)
        seen.append(os.getpriority(os.PRIO_PROCESS, me))

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return seen[0], seen[1]


def test_a_thread_lowers_its_own_priority_by_the_levels_asked_and_no_further_than_the_lowest():
    mine = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    before, after = _in_a_thread(7)
    assert before == mine and after == min(LOWEST, mine + 7)
    assert _in_a_thread(40)[1] == LOWEST
    assert _in_a_thread(0) == (mine, mine)  # 0: as it was
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == mine  # the caller's own is untouched
