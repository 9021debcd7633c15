"""What a worker asks of a backend call beside the call itself: one output per input (`check_outputs`),
the warm-up's timings for the cost model to start from (`measure_costs`), and which inputs of a failed
call fail on their own (`isolate`: one poison input does not take its neighbours down with it).
Plain functions of the backend and the inputs, run on the worker's thread."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from ..backends import BatchBackend


class OutputMismatch(RuntimeError):
    """The backend returned something other than one output per input."""


def check_outputs(outputs: Any, expected: int) -> list[Any]:
    if not isinstance(outputs, (list, tuple)):
        raise OutputMismatch(f"backend returned {type(outputs).__name__}, expected a list of {expected} outputs")
    if len(outputs) != expected:
        raise OutputMismatch(f"backend returned {len(outputs)} outputs for {expected} inputs")
    return list(outputs)


PROBE_CALL_LIMIT_S = 0.1  # a bucket's warm-up measurement stops doubling its batch once a call takes half this


def measure_costs(fn: BatchBackend, own: Callable[[int, int], float | None] | None, batches: Sequence[Sequence[Any]],
                  max_batch_size: int, clock: Callable[[], float] = time.monotonic) -> list[tuple[int, int, float]]:
    """What batches cost, for the cost model to start from: the backend's own figures (`own`, its
    `cost(size, bucket)`, e.g. timed CUDA graphs) when it has them, else each length bucket's warm-up
    batch (one per bucket, in bucket order) timed at 1, 2, 4... inputs up to `max_batch_size`, until a
    call takes half of `PROBE_CALL_LIMIT_S` (an expensive bucket is measured small, learned as it runs)."""
    if own is not None:
        known = ((b, n, own(n, b)) for b in range(len(batches)) for n in range(1, max_batch_size + 1))
        return [(b, n, float(s)) for b, n, s in known if s]
    measured = []
    for bucket, batch in enumerate(batches):
        size = 1
        while True:
            inputs = [batch[0]] * size
            started = clock()
            check_outputs(fn(inputs), size)
            seconds = clock() - started
            measured.append((bucket, size, seconds))
            if size >= max_batch_size or 2 * seconds > PROBE_CALL_LIMIT_S:
                break
            size = min(max_batch_size, 2 * size)
    return measured


def isolate(
    call: Callable[[list[Any]], list[Any]],
    inputs: list[Any],
    error: BaseException,
    outputs: list[Any],
    budget: int,
    give_up: Callable[[], bool] = lambda: False,
) -> dict[int, BaseException]:
    """Bisect a failed call, breadth first, within `budget` extra calls: both halves of a failed range
    are tried before either is split further, so a spent budget leaves whole clean halves answered
    rather than one deep probe. Fills `outputs` for the inputs that ran; returns the failures by index."""
    failures: dict[int, BaseException] = {}
    failed = deque([(0, len(inputs), error)])
    while failed:
        lo, hi, error = failed.popleft()
        if hi - lo == 1:
            failures[lo] = error
            continue
        mid = (lo + hi) // 2
        for a, b in ((lo, mid), (mid, hi)):
            if budget <= 0 or give_up():
                failures.update((i, error) for i in range(a, b))  # out of extra calls: fail the rest
                continue
            budget -= 1
            try:
                outputs[a:b] = call(inputs[a:b])
            except Exception as exc:  # noqa: BLE001
                failed.append((a, b, exc))
    return failures
