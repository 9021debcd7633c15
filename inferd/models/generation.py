"""A served generation model: admission and accounting around its engine (vLLM's, or any the config's
`backend` names: the contract's `GenerationEngine`).

The engine batches per token step by itself; what inferd adds is the same admission rules as for
batch models (auth, tiers as engine priorities, rate limits) plus bounds of its own on what waits for
the engine: requests that have not produced a first token yet, and their prompt tokens. The count is
checked before any tokenising, so an overloaded server refuses cheaply (503 with retry_after_ms), and
the check reserves the request's place: a burst cannot all pass the check while the first ones are
still being tokenised (which also bounds the tokeniser's queue). The prompt tokens are checked once
they are known, before the request is handed to the engine.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from ..backends import Delta, EngineStats, GenerationEngine, ToolPlan, build_engine, built_alone
from ..config import ModelConfig
from ..errors import InvalidInput, NotReady, ServiceOverloaded, describe, retry_after_ms
from ..observability.histogram import Histogram
from ..observability.snapshots import GenerationSnapshot
from .adapters import Adapter, Adapters
from .memory import check_fits

log = logging.getLogger("inferd.generation")


class GenerationMetrics:
    """Per generation model, recorded on the event loop."""

    def __init__(self) -> None:
        self.ttft = Histogram()
        self.time_per_output_token = Histogram((0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0))
        self.output_tokens = 0
        self.prompt_tokens = 0
        self.aborts: dict[str, int] = {}


class GenerationModel:
    """A generation engine in the server's loop, with inferd's bounds on what waits for it.

    Inside, every request is known by an id of the server's own (the engine's request id, the waiting
    accounting): a client's `X-Request-ID` is only a label, and two clients sending the same one never
    touch each other's requests."""

    kind = "generation"

    def __init__(self, config: ModelConfig, loop: asyncio.AbstractEventLoop, headroom_bytes: int = 0) -> None:
        self.config = config
        self.name = config.name
        self.loop = loop
        self.headroom_bytes = headroom_bytes  # memory that stays free (`memory_headroom_mb`)
        self.metrics = GenerationMetrics()
        self.ready = False
        self.start_error: BaseException | None = None
        self.engine: GenerationEngine | None = None
        try:
            self.engine = build_engine(config.backend, config.options, adapters=len(config.adapters))
        except (ImportError, TypeError, ValueError) as exc:  # a configuration mistake: this model's start-up failure, said once
            self.start_error = exc
        self.adapters = Adapters(self.name, self.engine)  # its LoRA adapters, by name
        self.waiting: dict[str, int] = {}  # engine request id -> prompt tokens, until its first token
        self.preparing = 0  # admitted, being tokenised: places reserved among the waiting
        self.running = 0
        self._waiting_tokens = 0
        self._engine_ids = itertools.count(1)
        # Prompts are tokenised here, off the event loop (one thread: a tokenizer is not shared).
        self._tokenizing = ThreadPoolExecutor(1, thread_name_prefix=f"tokenize-{self.name}")
        self._start_task: asyncio.Task | None = None

    def start(self) -> None:
        if self.start_error is not None:
            log.error("generation model %s cannot start: %s", self.name, describe(self.start_error))
            return
        self._start_task = self.loop.create_task(self._start(), name=f"engine-{self.name}")

    async def _start(self) -> None:
        engine = self.engine
        assert engine is not None
        try:
            # Will it fit? (the weights and the KV cache; a refusal says how much is free, before vLLM
            # takes the memory other models use)
            await self.loop.run_in_executor(None, check_fits, self.config, self.headroom_bytes)
            await self.loop.run_in_executor(None, built_alone, engine.start)  # seconds: keep /healthz answering
            for adapter in self.config.adapters:  # (one that cannot load fails the model's start, said once)
                await self.adapters.load(adapter.name, adapter.path, adapter.pinned)
            # (with logprobs: their first computation is a cold path of seconds, paid here, not by a client)
            warm = engine.sampling({"max_tokens": 2, "seed": 0, "logprobs": 1})
            async for _ in engine.generate(engine.encode("warm up"), warm, f"warmup-{self.name}", 0):
                pass
            self.ready = True
            log.info("generation model %s ready", self.name)
            # (vLLM's request model and tool parsers: seconds to import, before the first request with tools)
            self.loop.run_in_executor(None, built_alone, engine.preload)
        except Exception as exc:  # noqa: BLE001 - reported by /readyz
            log.error("generation model %s failed to start: %s", self.name, describe(exc))
            log.debug("generation model %s start-up failure", self.name, exc_info=True)
            self.start_error = exc

    async def stop(self) -> None:
        if self._start_task is not None and not self._start_task.done():
            await asyncio.gather(self._start_task, return_exceptions=True)
        self._tokenizing.shutdown(wait=False, cancel_futures=True)
        if self.engine is not None:
            await self.loop.run_in_executor(None, self.engine.shutdown)

    # ---- admission -------------------------------------------------------------------------------

    def check_length(self, chars: int) -> None:
        """First of all, before any tokenising: a prompt (or a chat's messages) over `max_input_chars`."""
        if chars > self.config.max_input_chars:
            raise InvalidInput(f"prompt is {chars} characters; model {self.name} accepts at most "
                               f"{self.config.max_input_chars}")

    def check_capacity(self) -> None:
        """Before tokenising: refuse when too much already waits for the engine; otherwise reserve the
        request's place, which `prompt_ids` (the next step, always) gives back."""
        if not self.ready:
            raise NotReady(f"model {self.name} is starting", retry_after_ms=1000)
        c = self.config
        waiting = len(self.waiting) + self.preparing
        if waiting >= c.max_waiting_requests or self._waiting_tokens >= c.max_waiting_prompt_tokens:
            raise self._overloaded(waiting)
        self.preparing += 1

    def _overloaded(self, waiting: int) -> ServiceOverloaded:
        return ServiceOverloaded(
            f"model {self.name} has {waiting} requests ({self._waiting_tokens} prompt tokens) waiting for the engine",
            retry_after_ms=self.retry_after_ms(),
            reason="queue_full",
        )

    @property
    def waiting_tokens(self) -> int:
        return self._waiting_tokens

    async def prompt_ids(self, text: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None,
                         tools: list[dict[str, Any]] | None = None) -> list[int]:
        """A prompt's token ids (a chat's, through its template), from the tokenizing thread: a long prompt
        never stalls the loop. Gives back the place `check_capacity` reserved: the caller hands the ids
        to `stream` with no await between, so the request is counted as waiting throughout.
        InvalidInput when it is empty or too long for the model; ServiceOverloaded when its tokens would
        take the waiting prompt tokens past their bound (unless nothing else waits)."""
        engine = self.engine
        assert engine is not None
        encode = partial(engine.encode_chat, messages, tools) if messages is not None else partial(engine.encode, text or "")
        try:
            ids = await self.loop.run_in_executor(self._tokenizing, encode)
        finally:
            self.preparing -= 1
        if self._waiting_tokens and self._waiting_tokens + len(ids) > self.config.max_waiting_prompt_tokens:
            raise self._overloaded(len(self.waiting) + self.preparing)
        if not ids:
            raise InvalidInput("the prompt is empty")
        if len(ids) >= engine.max_model_len:
            raise InvalidInput(f"prompt is {len(ids)} tokens; model {self.name} takes fewer than {engine.max_model_len}")
        return ids

    def tool_plan(self, body: dict[str, Any]) -> ToolPlan | None:
        """A chat request's `tools` and `tool_choice`, read as the engine reads them (vLLM's: as its own
        server does); None when it names none. InvalidInput where the engine refuses them."""
        if not self.ready or self.engine is None:
            raise NotReady(f"model {self.name} is starting", retry_after_ms=1000)
        try:
            return self.engine.tool_plan(body)
        except ValueError as exc:
            raise InvalidInput(f"tools: {exc}") from None

    def refused_by_client(self, error: BaseException) -> bool:
        """Whether the engine refused a request for the request's own sake (a 400, never a 500): a bad
        JSON schema, regex or tool parameters (the engine's `client_mistake`)."""
        return self.engine is not None and self.engine.client_mistake(error)

    def sampling(self, overrides: Mapping[str, Any]) -> Any:
        """The engine's sampling parameters for a request's own fields; InvalidInput when it refuses them."""
        assert self.engine is not None
        try:
            return self.engine.sampling(overrides)
        except Exception as exc:  # noqa: BLE001 - vLLM's own checks (its validation error is no ValueError)
            raise InvalidInput(f"bad sampling parameters: {describe(exc)}") from None

    def retry_after_ms(self) -> int:
        """About the time the waiting requests take to reach their first token, from recent TTFTs."""
        mean = self.metrics.ttft.mean or 0.1
        return retry_after_ms(mean * max(1, len(self.waiting)))

    def capacity_scale(self) -> float:
        """The engine schedules its own batches; its rate limits are not scaled."""
        return 1.0

    # ---- generating ------------------------------------------------------------------------------

    def engine_request_id(self) -> str:
        """A request's id in the engine (the server's own, unique in this engine): what its trace names."""
        return f"{self.name}-{next(self._engine_ids)}"

    async def stream(self, prompt_ids: list[int], sampling: Any, priority: int,
                     request_id: str | None = None, adapter: Adapter | None = None) -> AsyncGenerator[Delta, None]:
        """Deltas for one request (through `adapter`, one of `adapters`, when given), accounted as
        waiting until its first token, then running."""
        assert self.engine is not None
        request_id = request_id or self.engine_request_id()
        started = time.monotonic()
        self.waiting[request_id] = len(prompt_ids)
        self._waiting_tokens += len(prompt_ids)
        self.metrics.prompt_tokens += len(prompt_ids)
        first_at = last_at = 0.0
        tokens = 0
        try:
            lora = adapter.engine_request if adapter is not None else None
            async for delta in self.engine.generate(prompt_ids, sampling, request_id, priority, lora):
                now = time.monotonic()
                if not first_at:
                    first_at = now
                    self._leave_waiting(request_id)
                    self.running += 1
                    self.metrics.ttft.observe(now - started)
                elif delta.token_count:
                    self.metrics.time_per_output_token.observe((now - last_at) / delta.token_count)
                last_at = now
                tokens += delta.token_count
                self.metrics.output_tokens += delta.token_count
                yield delta
        finally:
            if first_at:
                self.running -= 1
            else:
                self._leave_waiting(request_id)

    def record_abort(self, reason: str) -> None:
        self.metrics.aborts[reason] = self.metrics.aborts.get(reason, 0) + 1

    def _leave_waiting(self, request_id: str) -> None:
        self._waiting_tokens -= self.waiting.pop(request_id, 0)

    def snapshot(self, now: float) -> GenerationSnapshot:
        stats, m = self._stats, self.metrics
        return GenerationSnapshot(
            name=self.name, ready=self.ready, ttft=m.ttft, time_per_output_token=m.time_per_output_token,
            prompt_tokens=m.prompt_tokens, output_tokens=m.output_tokens, waiting=len(self.waiting), running=self.running,
            engine_waiting=stats.waiting, engine_running=stats.running, kv_cache_usage=stats.kv_cache_usage,
            aborts=dict(m.aborts),
        )

    @property
    def _stats(self) -> EngineStats:
        return self.engine.stats if self.engine is not None else EngineStats()

    def describe(self) -> dict[str, Any]:
        stats = self._stats
        return {
            "id": self.name,
            "object": "model",
            "owned_by": "inferd",
            "name": self.name,
            "kind": self.kind,
            "ready": self.ready,
            **({"error": describe(self.start_error)} if self.start_error is not None else {}),
            "max_model_len": self.engine.max_model_len if self.engine is not None else None,
            "adapters": sorted(self.adapters.loaded),
            "max_waiting_requests": self.config.max_waiting_requests,
            "max_waiting_prompt_tokens": self.config.max_waiting_prompt_tokens,
            "stats": {
                "waiting": len(self.waiting),
                "running": self.running,
                "engine_running": stats.running,
                "engine_waiting": stats.waiting,
                "kv_cache_usage": stats.kv_cache_usage,
                "output_tokens": self.metrics.output_tokens,
            },
        }
