"""A generation engine without vLLM: it echoes the prompt's words back, one word a token step.

What it is for: the generation routes (completions, chat, streaming, `n` choices, stops, deadlines,
client aborts, the waiting bound, tier priorities, LoRA adapters) run and are tested on any machine in
seconds, where vLLM takes half a minute to start a model; and it shows what a generation engine is to
inferd (`contract.GenerationEngine`): one module and a config line,

    [[models]]
    name = "echo"
    kind = "generation"
    backend = "inferd.backends.echo_engine"

Its output is a function of the prompt alone, so a test can say what each request must get: a prompt's
tokens are its characters, and choice `k` of a prompt of words w0..wm-1 is w(k), w(k+1), ... cycling,
one word a token, `max_tokens` of them or until a `stop` string appears (left out, as vLLM leaves it
out). Through an adapter the words come upper-cased. At most `max_running`
requests generate at once (one step of `step_ms` each, side by side); the others wait in order of
priority (lower first), then arrival, as vLLM's priority scheduling has them.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .contract import Delta, EngineStats, TokenLogprob

_OPTIONS = {"step_ms", "max_running", "max_model_len", "max_tokens"}


def check_options(options: Mapping[str, Any]) -> None:
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(f"inferd.backends.echo_engine: unknown options {sorted(unknown)}; known: {sorted(_OPTIONS)}")
    for name in _OPTIONS & set(options):
        value = options[name]
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"inferd.backends.echo_engine: `{name}` must be a number >= 0")


def create(options: Mapping[str, Any], adapters: int = 0) -> EchoEngine:
    return EchoEngine(options, adapters)


@dataclass(frozen=True)
class Sampling:
    """What a request asked of its output."""

    n: int
    max_tokens: int
    stop: tuple[str, ...]
    logprobs: int | None
    min_tokens: int


class EchoEngine:
    """Echoes prompts back (see the module's docstring); everything on the event loop, nothing to build."""

    def __init__(self, options: Mapping[str, Any], adapters: int = 0) -> None:
        check_options(options)
        self.step_s = float(options.get("step_ms", 1.0)) / 1000
        self.max_running = max(1, int(options.get("max_running", 8)))
        self.max_model_len = int(options.get("max_model_len", 2048))
        self.default_max_tokens = int(options.get("max_tokens", 16))
        self.lora_enabled = adapters > 0
        self.adapter_room = max(adapters, 2) if adapters else 0
        self.stats = EngineStats(max_running=self.max_running)
        self._adapters: dict[int, str] = {}
        self._queue: list[tuple[int, int, asyncio.Future[None]]] = []  # (priority, arrival, its turn)
        self._arrivals = itertools.count()
        self._unfinished: set[str] = set()

    def start(self) -> None:
        pass

    def shutdown(self) -> None:
        for _, _, turn in self._queue:
            if not turn.done():
                turn.cancel()

    def preload(self) -> None:
        pass

    # ---- on the way in ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return [ord(c) for c in text]

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        return self.encode(" ".join(str(m.get("content") or "") for m in messages))

    def tool_plan(self, body: dict[str, Any]) -> None:
        if body.get("tools"):
            raise ValueError("the echo engine reads no tool calls")
        return None

    def sampling(self, overrides: Mapping[str, Any]) -> Sampling:
        if overrides.get("structured_outputs") is not None:
            raise ValueError("the echo engine holds no output to a schema")
        stop = overrides.get("stop") or ()
        return Sampling(n=int(overrides.get("n", 1)), max_tokens=int(overrides.get("max_tokens") or self.default_max_tokens),
                        stop=(stop,) if isinstance(stop, str) else tuple(stop), logprobs=overrides.get("logprobs"),
                        min_tokens=int(overrides.get("min_tokens", 0)))

    def client_mistake(self, error: BaseException) -> bool:
        return isinstance(error, (ValueError, TypeError))

    # ---- generating ------------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: Any, request_id: str, priority: int,
                       adapter: Any = None) -> AsyncIterator[Delta]:
        """One word per choice per step, after waiting for a place among the running."""
        self._unfinished.add(request_id)
        try:
            await self._place(priority)
            try:
                async for delta in self._steps(prompt_ids, sampling, adapter):
                    yield delta
            finally:
                self._leave()
        finally:
            self._unfinished.discard(request_id)

    async def _place(self, priority: int) -> None:
        """A place among the running, counted from the moment it is given (so no newcomer takes it
        before the waiter it was given to runs)."""
        if self.stats.running < self.max_running and not self._queue:
            self.stats.running += 1
            return
        turn: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self._queue, (priority, next(self._arrivals), turn))
        self.stats.waiting += 1
        try:
            await turn
        except asyncio.CancelledError:
            if turn.done() and not turn.cancelled():  # (given its place as it left: pass the place on)
                self._leave()
            raise
        finally:
            self.stats.waiting -= 1

    def _leave(self) -> None:
        """A running request gives its place to the first waiting, by priority then arrival."""
        self.stats.running -= 1
        while self._queue:
            _, _, turn = heapq.heappop(self._queue)
            if not turn.done():
                self.stats.running += 1
                turn.set_result(None)
                return

    async def _steps(self, prompt_ids: list[int], sampling: Sampling, adapter: Any) -> AsyncIterator[Delta]:
        text = EchoText(prompt_ids, sampling, adapter is not None)
        while not text.ended:
            await asyncio.sleep(self.step_s)
            for delta in text.step():
                yield delta

    # ---- adapters --------------------------------------------------------------------------------

    async def add_adapter(self, name: str, adapter_id: int, path: str, pinned: bool) -> Any:
        if not os.path.isfile(os.path.join(path, "adapter_config.json")):
            raise ValueError(f"{path} has no adapter_config.json")
        self._adapters[adapter_id] = name
        return adapter_id

    async def remove_adapter(self, adapter_id: int) -> None:
        self._adapters.pop(adapter_id, None)

    def unfinished_requests(self) -> int:
        return len(self._unfinished)



class EchoText:
    """What the echo engine writes for one request, a token step at a time (see the module's
    docstring): each choice's next word, a stop string cut, the last delta marked done."""

    def __init__(self, prompt_ids: list[int], sampling: Sampling, upper: bool) -> None:
        self.words = "".join(map(chr, prompt_ids)).split() or ["."]
        self.prompt_tokens = len(prompt_ids)
        self.sampling = sampling
        self.upper = upper
        self.texts = [""] * sampling.n
        self.finished = [False] * sampling.n
        self.made = 0
        self.steps = 0
        self.ended = sampling.max_tokens <= 0

    def step(self) -> list[Delta]:
        sampling, words, step = self.sampling, self.words, self.steps
        self.steps += 1
        deltas = []
        for k in range(sampling.n):
            if self.finished[k]:
                continue
            word = words[(k + step) % len(words)]
            word = word.upper() if self.upper else word
            piece = (" " if self.texts[k] else "") + word
            self.made += 1
            text = self.texts[k] + piece
            at = min((text.find(s) for s in sampling.stop if s and s in text), default=-1)
            stopped = at >= 0 and step + 1 >= sampling.min_tokens
            if stopped:  # (the text up to the stop string; what was sent before it stays sent)
                piece = text[len(self.texts[k]):at] if at > len(self.texts[k]) else ""
            self.texts[k] += piece
            last = stopped or step + 1 == sampling.max_tokens
            self.finished[k] = last
            logprobs = None if sampling.logprobs is None else [TokenLogprob(piece, 0.0, [(piece, 0.0)])]
            deltas.append(Delta(piece, 1, last, ("stop" if stopped else "length") if last else None,
                                self.prompt_tokens, self.made, logprobs, k, token_ids=[ord(c) for c in piece]))
        if all(self.finished):
            deltas[-1].done = True
            self.ended = True
        return deltas
