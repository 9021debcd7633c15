"""GenerationModel's bounds on what waits for the engine, with a stand-in engine (no vLLM here: the
real engine's requests are tested in tests/e2e/test_backend_vllm.py)."""

from __future__ import annotations

import asyncio
import threading

import pytest

from inferd.backends import EngineStats
from inferd.config import ModelConfig
from inferd.errors import ServiceOverloaded
from inferd.models.generation import GenerationModel


class HeldTokeniser:
    """An engine whose tokeniser waits until the test lets it go: a burst arrives while the first
    prompts are still being tokenised."""

    max_model_len = 512
    stats = EngineStats()

    def __init__(self, tokens_per_prompt: int) -> None:
        self.go = threading.Event()
        self.tokens = tokens_per_prompt

    def encode(self, text: str) -> list[int]:
        self.go.wait(5)
        return list(range(self.tokens))


def model_with(engine: HeldTokeniser, **limits) -> GenerationModel:
    config = ModelConfig(name="gen", kind="generation", backend="inferd.backends.vllm",
                         options={"model_path": "."}, **limits)
    model = GenerationModel(config, asyncio.get_running_loop())
    model.engine = engine  # type: ignore[assignment]
    model.ready = True
    return model


async def admit_and_tokenise(model: GenerationModel) -> list[int]:
    promise = model.check_capacity()
    return await model.prompt_ids(promise, "a prompt")


@pytest.mark.asyncio
async def test_a_burst_cannot_all_pass_the_waiting_bound_while_being_tokenised():
    engine = HeldTokeniser(tokens_per_prompt=10)
    model = model_with(engine, max_waiting_requests=8)
    calls = [asyncio.ensure_future(admit_and_tokenise(model)) for _ in range(60)]
    await asyncio.sleep(0)  # every call has run its admission check
    refused = [c for c in calls if c.done() and isinstance(c.exception(), ServiceOverloaded)]
    assert len(refused) == 52
    assert model.preparing == 8 and model.book.waiting == 8
    engine.go.set()
    admitted = await asyncio.gather(*(c for c in calls if c not in refused))
    assert len(admitted) == 8
    assert model.preparing == 0  # every reserved place moved on to the waiting
    assert model.book.waiting == 8 and model.waiting == 8
    model._tokenizing.shutdown()


@pytest.mark.asyncio
async def test_prompt_tokens_past_their_bound_are_refused_once_known():
    engine = HeldTokeniser(tokens_per_prompt=300)
    engine.go.set()
    model = model_with(engine, max_waiting_requests=100, max_waiting_prompt_tokens=1000)
    streams = []
    for _ in range(3):  # 900 tokens waiting (each in the engine's queue, no first token yet)
        promise = model.check_capacity()
        ids = await model.prompt_ids(promise, "a prompt")
        promise.submitted_at = 1.0  # (handed to the engine, as `stream` would)
        model._waiting_tokens += len(ids)
        streams.append(ids)
    with pytest.raises(ServiceOverloaded):
        await admit_and_tokenise(model)  # 900 + 300 > 1000, found once the prompt is tokenised
    assert model.preparing == 0 and model.book.waiting == 3  # the refused one's place given back
    model._tokenizing.shutdown()


@pytest.mark.asyncio
async def test_a_lone_prompt_over_the_token_bound_still_runs():
    engine = HeldTokeniser(tokens_per_prompt=300)
    engine.go.set()
    model = model_with(engine, max_waiting_prompt_tokens=100)
    assert len(await admit_and_tokenise(model)) == 300  # nothing else waits: the bound cannot help anyone
    model._tokenizing.shutdown()
