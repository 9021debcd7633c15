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


def test_the_levels_count_from_the_event_loops_thread_so_asking_again_only_ever_lowers():
    # The executor asks for `worker_nice` at its start and for the backend's `execute_nice` once built;
    # a thread started by a lowered one begins where its parent is.
    main = os.getpriority(os.PRIO_PROCESS, threading.main_thread().native_id)
    seen: list[int] = []

    def level() -> int:
        return os.getpriority(os.PRIO_PROCESS, threading.get_native_id())

    def child() -> None:
        seen.append(level())
        lower_this_thread(3)  # (already 3 below the loop: stays)
        seen.append(level())

    def run() -> None:
        for nice in (3, 2, 5):
            lower_this_thread(nice)
            seen.append(level())
        started = threading.Thread(target=child)
        started.start()
        started.join()

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    assert seen == [min(LOWEST, main + n) for n in (3, 3, 5, 5, 5)]
