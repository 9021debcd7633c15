"""The preprocessing stage: micro-batches of arriving requests prepared on a thread, never on the loop."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inferd.messages import PendingRequest
from inferd.scheduling.preprocess import Preprocessor


def _request(loop: asyncio.AbstractEventLoop, i: int) -> PendingRequest:
    return PendingRequest(f"r{i}", None, 0.0, 1e9, loop.create_future(), raw=f"text {i}")


async def test_requests_put_in_one_loop_turn_are_prepared_in_one_call_off_the_loop():
    loop = asyncio.get_running_loop()
    calls: list[tuple[list[str], str]] = []
    done = asyncio.Event()
    prepared: list[tuple[list[PendingRequest], list]] = []

    def prepare_batch(items):
        calls.append((list(items), threading.current_thread().name))
        return [f"<{item}>" for item in items]

    def on_prepared(requests, results):
        prepared.append((requests, list(results)))
        done.set()

    stage = Preprocessor(prepare_batch, loop, on_prepared, "m")
    requests = [_request(loop, i) for i in range(5)]
    for r in requests:
        stage.put(r)
    await asyncio.wait_for(done.wait(), 5)
    stage.stop()
    assert calls == [([f"text {i}" for i in range(5)], "inferd-prepare-m")]
    assert prepared == [(requests, [f"<text {i}>" for i in range(5)])]  # in order, one result each


async def test_arrivals_while_the_thread_works_go_together_in_its_next_call():
    loop = asyncio.get_running_loop()
    release = threading.Event()
    started = threading.Event()
    sizes: list[int] = []
    finished = asyncio.Event()
    count = 0

    def prepare_batch(items):
        sizes.append(len(items))
        started.set()
        release.wait(5)  # the first call holds the thread until the rest have arrived
        return list(items)

    def on_prepared(requests, results):
        nonlocal count
        count += len(requests)
        if count == 4:
            finished.set()

    stage = Preprocessor(prepare_batch, loop, on_prepared, "m")
    stage.put(_request(loop, 0))
    assert await loop.run_in_executor(None, started.wait, 5)  # the thread is inside its first call
    for i in range(1, 4):
        stage.put(_request(loop, i))
    assert stage.waiting == 3
    release.set()
    await asyncio.wait_for(finished.wait(), 5)
    stage.stop()
    assert sizes == [1, 3]


async def test_a_failed_call_refuses_every_input_in_it_and_the_thread_goes_on():
    loop = asyncio.get_running_loop()
    results: list = []
    got = asyncio.Event()
    first = asyncio.Event()

    def prepare_batch(items):
        if "text 0" in items:
            raise RuntimeError("tokenizer broke")
        return list(items)

    def on_prepared(requests, outcome):
        results.extend(outcome)
        first.set()
        if len(results) == 2:
            got.set()

    stage = Preprocessor(prepare_batch, loop, on_prepared, "m")
    stage.put(_request(loop, 0))
    await asyncio.wait_for(first.wait(), 5)
    stage.put(_request(loop, 1))
    await asyncio.wait_for(got.wait(), 5)
    stage.stop()
    assert isinstance(results[0], RuntimeError) and results[1] == "text 1"


async def test_several_threads_share_what_waits_and_work_at_once():
    """A backend asking for 3 threads (an image decoder): 7 arrivals split 3/2/2 among them, the three
    calls inside `prepare_batch` at the same time (a barrier only they can pass together), every input
    answered with its own result, and every thread ended by `stop`."""
    loop = asyncio.get_running_loop()
    together = threading.Barrier(3, timeout=5)
    calls: list[tuple[list[str], str]] = []
    prepared: dict[str, str] = {}
    finished = asyncio.Event()

    def prepare_batch(items):
        together.wait()  # (a BrokenBarrierError, answered as every input's error, if the calls ran one by one)
        calls.append((list(items), threading.current_thread().name))
        return [f"<{item}>" for item in items]

    def on_prepared(requests, results):
        prepared.update((r.raw, result) for r, result in zip(requests, results, strict=True))
        if len(prepared) == 7:
            finished.set()

    before = {t.name for t in threading.enumerate()}
    stage = Preprocessor(prepare_batch, loop, on_prepared, "m", threads=3)
    for i in range(7):
        stage.put(_request(loop, i))
    await asyncio.wait_for(finished.wait(), 5)
    assert stage.idle
    assert prepared == {f"text {i}": f"<text {i}>" for i in range(7)}
    assert sorted(len(items) for items, _ in calls) == [2, 2, 3]
    assert {name for _, name in calls} == {"inferd-prepare-m-0", "inferd-prepare-m-1", "inferd-prepare-m-2"}
    stage.stop()
    for _ in range(50):
        if not {t.name for t in threading.enumerate()} - before:
            break
        await asyncio.sleep(0.02)
    assert not {t.name for t in threading.enumerate()} - before  # the three threads ended


def test_a_preprocessor_needs_a_thread():
    loop = asyncio.new_event_loop()
    try:
        with pytest.raises(ValueError, match="at least one thread"):
            Preprocessor(list, loop, lambda requests, results: None, "m", threads=0)
    finally:
        loop.close()


async def test_what_nobody_waits_for_is_never_prepared_and_tenants_take_turns():
    """A call of many inputs whose client went away is dropped before its inputs are prepared (60 large
    images once held the only decoding thread 36 s after their client had gone), and another tenant's
    lone input goes between one tenant's many, not after all of them."""
    from inferd.messages import RequestState

    loop = asyncio.get_running_loop()
    calls: list[list[str]] = []
    done = asyncio.Event()

    def prepare_batch(items):
        calls.append(list(items))
        return list(items)

    stage = Preprocessor(prepare_batch, loop, lambda requests, results: done.set(), "m")
    many = [_request(loop, i) for i in range(4)]
    gone = _request(loop, 99)
    lone = _request(loop, 7)
    lone.tenant, lone.raw = "other", "lone"
    for r in (*many, gone, lone):
        stage.put(r)
    gone.state = RequestState.CANCELLED  # its client went away before the thread took it
    await asyncio.wait_for(done.wait(), 5)
    stage.stop()
    assert calls == [["text 0", "lone", "text 1", "text 2", "text 3"]]


async def test_a_small_calls_inputs_share_its_longest_inputs_bucket():
    """Where buckets are lengths, a small call's inputs are queued in one bucket (its longest input's), so
    they can go in one batch; a single request, a call over the limit and a failed input keep theirs."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    prepared: list = []
    by_text = {"s0": ("a", 0, 3), "s1": ("b", 2, 90), "s2": ("c", 1, 40), "bad": ValueError("too long"),
               "lone": ("d", 0, 5), "b0": ("e", 0, 4), "b1": ("f", 1, 30), "b2": ("g", 2, 80)}

    def on_prepared(requests, results):
        prepared.extend(zip((r.raw for r in requests), results, strict=True))
        done.set()

    stage = Preprocessor(lambda items: [by_text[i] for i in items], loop, on_prepared, "m", together_limit=4)
    for i, (text, call) in enumerate([("s0", "small"), ("s1", "small"), ("s2", "small"), ("bad", "small"),
                                      ("lone", None), ("b0", "big"), ("b1", "big"), ("b2", "big")]):
        request = _request(loop, i)
        request.raw, request.call_id, request.call_size = text, call, 4 if call == "small" else 5
        stage.put(request)
    big = [_request(loop, 10 + i) for i in range(2)]  # (a call of 5: over the limit of 4)
    for request in big:
        request.raw, request.call_id, request.call_size = "b0", "big", 5
        stage.put(request)
    await asyncio.wait_for(done.wait(), 5)
    stage.stop()
    results = dict(prepared[:8])
    assert [results[t] for t in ("s0", "s1", "s2")] == [("a", 2, 3), ("b", 2, 90), ("c", 2, 40)]  # tokens kept
    assert isinstance(results["bad"], ValueError)
    assert results["lone"] == ("d", 0, 5)
    assert [results[t] for t in ("b0", "b1", "b2")] == [("e", 0, 4), ("f", 1, 30), ("g", 2, 80)]


async def test_a_short_call_is_prepared_next_and_alone_and_large_calls_go_in_small_micro_batches():
    """A 2-input call arriving behind a 6-input one is prepared in the thread's next call, by itself (not
    after the large call's inputs, nor in one call with them); the large call's inputs go three at a time
    (`large_micro_batch`), so a short call arriving meanwhile waits for three of them at most."""
    loop = asyncio.get_running_loop()
    release, started = threading.Event(), threading.Event()
    calls: list[list[str]] = []
    done = asyncio.Event()

    def prepare_batch(items):
        calls.append(list(items))
        started.set()
        release.wait(5)  # the first call holds the thread until the rest have arrived
        return list(items)

    def on_prepared(requests, results):
        if sum(len(c) for c in calls) == 9:
            done.set()

    stage = Preprocessor(prepare_batch, loop, on_prepared, "m", short_call=2, large_micro_batch=3)
    stage.put(_request(loop, 0))
    assert await loop.run_in_executor(None, started.wait, 5)
    for i in range(6):
        request = _request(loop, 10 + i)
        request.raw, request.call_id, request.call_size = f"L{i}", "large", 6
        stage.put(request)
    for i in range(2):
        request = _request(loop, 20 + i)
        request.raw, request.call_id, request.call_size = f"S{i}", "short", 2
        stage.put(request)
    release.set()
    await asyncio.wait_for(done.wait(), 5)
    stage.stop()
    assert calls == [["text 0"], ["S0", "S1"], ["L0", "L1", "L2"], ["L3", "L4", "L5"]]
