"""A simulated continuous-batching engine with a GPU's costs: generation's admission and overload are
measured and tested at a GPU's scale on any machine, with no GPU and no vLLM.

It writes what the echo engine writes (`echo_engine.EchoText`: a request's output is a function of its
prompt), at the pace a vLLM engine on a GPU would. Its scheduler is vLLM's in outline (`EngineCore`):

- at most `max_running` sequences run; the others wait, by priority (lower first) then arrival;
- every step each running sequence that has read its prompt makes one token, and the prompts being
  read share what is left of the step's token budget (`max_batched_tokens`: chunked prefill); the step
  that reads a prompt's last chunk makes its first token;
- the KV cache holds `kv_cache_tokens` (every sequence's prompt and output so far); a sequence starts
  only when its prompt fits, and when the running sequences' next tokens do not, the lowest priority,
  latest arrival is preempted: its cache freed, it waits again to read its prompt and output anew;
- a step takes `step_ms` + `step_ms_per_sequence` per running sequence + `step_ms_per_1k_context` per
  thousand tokens of cache in use + its prefill tokens at `prefill_tokens_per_s`.

The defaults are an H100's order of figures for an 8B model: ~15 ms a step at 64 sequences, 20,000
prompt tokens/s. The core is a pure function of its steps (unit tests drive it on a fake clock); the
engine runs it on the event loop, one step after another on the clock's schedule, so the server's own
work does not slow the simulated GPU down.

    [[models]]
    name = "sim-llm"
    kind = "generation"
    backend = "inferd.backends.sim_engine"
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from .contract import Delta
from .echo_engine import EchoEngine, EchoText

_OPTIONS = {"step_ms", "step_ms_per_sequence", "step_ms_per_1k_context", "prefill_tokens_per_s", "max_running",
            "max_batched_tokens", "kv_cache_tokens", "max_model_len", "max_tokens"}

_MOST_BEHIND_S = 0.05  # how far behind its schedule a step may run and still be caught up


@dataclass(frozen=True)
class Profile:
    """The simulated GPU's figures (see the module's docstring)."""

    step_ms: float = 8.0
    step_ms_per_sequence: float = 0.1
    step_ms_per_1k_context: float = 0.05
    prefill_tokens_per_s: float = 20_000.0
    max_running: int = 64
    max_batched_tokens: int = 2048
    kv_cache_tokens: int = 131_072

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Profile:
        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(f"inferd.backends.sim_engine: unknown options {sorted(unknown)}; known: {sorted(_OPTIONS)}")
        for name in _OPTIONS & set(options):
            value = options[name]
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                raise ValueError(f"inferd.backends.sim_engine: `{name}` must be a number >= 0")
        given = {k: options[k] for k in cls.__dataclass_fields__ if k in options}
        profile = cls(**given)
        if profile.prefill_tokens_per_s <= 0 or profile.max_running < 1 or profile.max_batched_tokens < 1:
            raise ValueError("inferd.backends.sim_engine: `prefill_tokens_per_s`, `max_running` and "
                             "`max_batched_tokens` must be positive")
        return profile


@dataclass(eq=False, slots=True)
class Sequence:
    """One request in the simulated engine."""

    request_id: str
    priority: int
    order: int
    prompt_tokens: int
    max_tokens: int
    to_read: int = 0  # tokens still to prefill (its prompt; after a preemption, its output too)
    made: int = 0
    cached: int = 0  # its tokens in the KV cache
    preempted: int = 0
    state: int = 0  # WAITING, RUNNING or DONE
    unread: int = 0  # tokens made that its reader has not taken yet


WAITING, RUNNING, DONE = 0, 1, 2


class EngineCore:
    """The scheduler and the step costs, with no clock: `step` says what one step makes and how long it
    takes; whoever drives it waits that long."""

    def __init__(self, profile: Profile) -> None:
        self.profile = profile
        self.waiting: list[tuple[int, int, Sequence]] = []  # (priority, order, sequence)
        self.running: list[Sequence] = []
        self.cached = 0  # tokens in the KV cache
        self.preemptions = 0
        self._orders = itertools.count()
        self._gone: set[Sequence] = set()

    def add(self, request_id: str, prompt_tokens: int, max_tokens: int, priority: int = 0) -> Sequence:
        seq = Sequence(request_id, priority, next(self._orders), prompt_tokens, max(1, max_tokens), to_read=prompt_tokens)
        heapq.heappush(self.waiting, (priority, seq.order, seq))
        return seq

    def abort(self, seq: Sequence) -> None:
        if seq.state == RUNNING:
            self.running.remove(seq)
            self.cached -= seq.cached
        elif seq.state == WAITING:
            self._gone.add(seq)  # (taken out of the heap when it comes up)
        seq.state = DONE

    @property
    def busy(self) -> bool:
        return bool(self.running) or len(self.waiting) > len(self._gone)

    def step(self) -> tuple[float, list[Sequence]]:
        """One step: (its seconds, the sequences that made a token, each once). Finished ones leave."""
        p = self.profile
        self._start_waiting()
        decoding = [s for s in self.running if s.to_read == 0]
        while decoding and self.cached + len(decoding) > p.kv_cache_tokens and len(self.running) > 1:
            victim = max(self.running, key=lambda s: (s.priority, s.order))
            self._preempt(victim)
            if victim in decoding:
                decoding.remove(victim)
        budget = p.max_batched_tokens - len(decoding)
        prefilled = 0
        made = list(decoding)
        for seq in self.running:
            if seq.to_read and budget > 0:
                chunk = min(seq.to_read, budget)
                seq.to_read -= chunk
                seq.cached += chunk
                self.cached += chunk
                budget -= chunk
                prefilled += chunk
                if seq.to_read == 0:
                    made.append(seq)
        for seq in decoding:
            seq.cached += 1
            self.cached += 1
        context = self.cached
        seconds = (p.step_ms + p.step_ms_per_sequence * len(self.running) + p.step_ms_per_1k_context * context / 1000) / 1000 \
            + prefilled / p.prefill_tokens_per_s
        for seq in made:
            seq.made += 1
            if seq.made >= seq.max_tokens:
                self.running.remove(seq)
                self.cached -= seq.cached
                seq.state = DONE
        return seconds, made

    def _start_waiting(self) -> None:
        p = self.profile
        while self.waiting and len(self.running) < p.max_running:
            _, _, seq = self.waiting[0]
            if seq in self._gone:
                heapq.heappop(self.waiting)
                self._gone.discard(seq)
                continue
            if self.cached + seq.to_read + 1 > p.kv_cache_tokens and self.running:
                return  # (its prompt does not fit yet: it waits for a sequence to end)
            heapq.heappop(self.waiting)
            self.running.append(seq)
            seq.state = RUNNING

    def _preempt(self, seq: Sequence) -> None:
        self.running.remove(seq)
        self.cached -= seq.cached
        seq.cached = 0
        seq.to_read = seq.prompt_tokens + seq.made
        seq.preempted += 1
        seq.state = WAITING
        self.preemptions += 1
        heapq.heappush(self.waiting, (seq.priority, seq.order, seq))


def check_options(options: Mapping[str, Any]) -> None:
    Profile.from_options({k: v for k, v in options.items() if k not in ("max_model_len", "max_tokens")})


def create(options: Mapping[str, Any], adapters: int = 0) -> SimEngine:
    return SimEngine(options, adapters)


class SimEngine(EchoEngine):
    """The echo engine's text at the simulated GPU's pace (see the module's docstring)."""

    def __init__(self, options: Mapping[str, Any], adapters: int = 0) -> None:
        shared = {k: options[k] for k in ("max_model_len", "max_tokens") if k in options}
        super().__init__(shared, adapters)
        self.profile = Profile.from_options({k: v for k, v in options.items() if k not in shared})
        self.max_running = self.profile.max_running
        self.core = EngineCore(self.profile)
        self.stats.max_running, self.stats.kv_cache_tokens = self.profile.max_running, self.profile.kv_cache_tokens
        self._readers: dict[Sequence, asyncio.Future[None]] = {}
        self._wake: asyncio.Event | None = None
        self._driver: asyncio.Task[None] | None = None

    def shutdown(self) -> None:
        """Stop stepping; the requests it runs end with an error (as a real engine's do when its core
        stops), not waiting for tokens that will never come."""
        if self._driver is not None:
            self._driver.cancel()
        for reader in self._readers.values():
            if not reader.done():
                reader.set_exception(RuntimeError("the engine stopped"))

    async def generate(self, prompt_ids: list[int], sampling: Any, request_id: str, priority: int,
                       adapter: Any = None) -> AsyncIterator[Delta]:
        text = EchoText(prompt_ids, sampling, adapter is not None)
        seq = self.core.add(request_id, len(prompt_ids) * sampling.n, sampling.max_tokens, priority)
        self._unfinished.add(request_id)
        self._ensure_driver()
        try:
            while not text.ended:
                while not seq.unread:
                    ready = self._readers[seq] = asyncio.get_running_loop().create_future()
                    await ready
                seq.unread -= 1
                for delta in text.step():
                    yield delta
        finally:
            self._readers.pop(seq, None)
            self.core.abort(seq)  # (a no-op once it has made its last token)
            self._unfinished.discard(request_id)
            self._count()

    def _ensure_driver(self) -> None:
        if self._wake is None:
            self._wake = asyncio.Event()
        if self._driver is None or self._driver.done():
            self._driver = asyncio.get_running_loop().create_task(self._drive(), name="sim-engine")
        self._wake.set()

    async def _drive(self) -> None:
        """Steps back to back on the clock's schedule: a step due while the loop was busy is not moved
        later, so the simulated GPU's rate does not depend on the server's own load."""
        loop = asyncio.get_running_loop()
        wake = self._wake
        assert wake is not None
        due = loop.time()
        while True:
            if not self.core.busy:
                self._count()
                wake.clear()
                await wake.wait()
                due = loop.time()
            seconds, made = self.core.step()
            self._count()
            due += seconds
            if due < loop.time() - _MOST_BEHIND_S:  # (a loop stalled for long: start the schedule again)
                due = loop.time()
            await asyncio.sleep(max(0.0, due - loop.time()))
            for seq in made:
                seq.unread += 1
                reader = self._readers.pop(seq, None)
                if reader is not None and not reader.done():
                    reader.set_result(None)

    def _count(self) -> None:
        core, stats = self.core, self.stats
        stats.running = len(core.running)
        stats.waiting = len(core.waiting) - len(core._gone)
        stats.kv_cache_usage = core.cached / self.profile.kv_cache_tokens if self.profile.kv_cache_tokens else 0.0
        stats.preemptions = core.preemptions
