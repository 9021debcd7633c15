"""The echo engine's own scheduling: at most `max_running` generate at once, the others wait by priority
then arrival, and a waiter that leaves takes no place with it."""

from __future__ import annotations

import asyncio

import pytest

from inferd.backends.echo_engine import EchoEngine


async def run(engine: EchoEngine, name: str, priority: int, tokens: int, order: list[str], most: list[int]) -> None:
    sampling = engine.sampling({"max_tokens": tokens})
    async for _ in engine.generate(engine.encode(name), sampling, name, priority):
        most.append(engine.stats.running)
        if name not in order:
            order.append(name)


@pytest.mark.asyncio
async def test_one_place_goes_by_priority_then_arrival_and_a_leaver_frees_its_turn():
    engine = EchoEngine({"step_ms": 0, "max_running": 1})
    order: list[str] = []
    most: list[int] = []
    first = asyncio.create_task(run(engine, "first", 0, 50, order, most))
    await asyncio.sleep(0)  # (first holds the one place)
    late = asyncio.create_task(run(engine, "late", 0, 2, order, most))
    leaver = asyncio.create_task(run(engine, "leaver", -5, 2, order, most))
    urgent = asyncio.create_task(run(engine, "urgent", -1, 2, order, most))
    await asyncio.sleep(0)
    assert (engine.stats.running, engine.stats.waiting) == (1, 3)
    leaver.cancel()
    await asyncio.gather(first, late, urgent)
    assert leaver.cancelled()
    assert order == ["first", "urgent", "late"]
    assert max(most) == 1
    assert (engine.stats.running, engine.stats.waiting, engine.unfinished_requests()) == (0, 0, 0)


@pytest.mark.asyncio
async def test_choices_echo_the_prompt_from_their_own_word_and_stop_where_asked():
    engine = EchoEngine({"step_ms": 0})
    sampling = engine.sampling({"n": 2, "max_tokens": 4, "stop": ["c"]})
    texts = {0: "", 1: ""}
    reasons = {}
    async for delta in engine.generate(engine.encode("a b c"), sampling, "r", 0):
        texts[delta.index] += delta.text
        if delta.finished:
            reasons[delta.index] = delta.finish_reason
    assert texts == {0: "a b ", 1: "b "} and reasons == {0: "stop", 1: "stop"}
