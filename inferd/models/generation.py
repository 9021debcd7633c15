"""A served generation model: admission and accounting around its engine (vLLM's, or any the config's
`backend` names: the contract's `GenerationEngine`).

The engine batches per token step by itself; what inferd adds is the same admission rules as for
batch models (auth, tiers as engine priorities, rate limits) plus bounds of its own on what waits for
the engine: requests that have not produced a first token yet, and their prompt tokens. The count is
checked before any tokenising, so an overloaded server refuses cheaply (503 with retry_after_ms), and
the check reserves the request's place: a burst cannot all pass the check while the first ones are
still being tokenised (which also bounds the tokeniser's queue). The prompt tokens are checked once
they are known, before the request is handed to the engine. Where the model or the tier sets objectives
(`ttft_slo_ms`, `tpot_slo_ms`), each request is also admitted by its predicted time to first token and
per output token (`generation_promises`), from costs learnt from what the engine runs (`engine_costs`).

Why one module: a request's place among the engine's requests is taken at admission, moved when its
prompt is tokenised and given back when its stream ends, and those three steps and their counts must
change together; the predictions and the costs they rest on live in their own modules.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from functools import partial
from typing import Any

from ..backends import Delta, EngineStats, GenerationEngine, ToolPlan, build_engine, built_alone
from ..config import ModelConfig, TierConfig
from ..errors import InferdError, InvalidInput, NotReady, ServiceOverloaded, describe, retry_after_ms
from ..observability.snapshots import GenerationMetrics, GenerationSnapshot
from .adapters import Adapter, Adapters
from .engine_costs import EngineCosts
from .generation_promises import NO_OBJECTIVES, EngineBook, Objectives, Promise
from .generation_refusals import refusal
from .memory import check_fits

log = logging.getLogger("inferd.generation")


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
        self.stopping = False  # (stopped, or stopping: not ready again)
        self.start_error: BaseException | None = None
        self.engine: GenerationEngine | None = None
        try:
            self.engine = build_engine(config.backend, config.options, adapters=len(config.adapters))
        except (ImportError, TypeError, ValueError) as exc:  # a configuration mistake: this model's start-up failure, said once
            self.start_error = exc
        self.adapters = Adapters(self.name, self.engine)  # its LoRA adapters, by name
        self.costs = EngineCosts()
        self.book = EngineBook(self.costs)  # every admitted request, until its last token
        self._kept: dict[str, asyncio.Future[None]] = {}  # by engine request id: kept back for KV, until handed over
        self.preparing = 0  # admitted, being tokenised: places reserved among the waiting
        self._waiting_tokens = 0  # the prompt tokens of those handed to the engine without a first token
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
        """Stop the engine. The requests kept back for KV room are answered first (a 503: the model is
        going), or they would wait for an engine that is gone until their deadlines; those it runs end
        with the same 503 (`stream`: vLLM ends them "abort", the simulated engine fails them)."""
        self.ready, self.stopping = False, True
        for kept in self._kept.values():
            if not kept.done():
                kept.set_exception(self.not_ready())
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

    def objectives(self, tier: TierConfig | None) -> Objectives:
        """What a request of `tier` is promised: the tighter of the model's and the tier's objectives."""
        def tighter(*values: float | None) -> float | None:
            given = [v for v in values if v is not None]
            return min(given) / 1000 if given else None
        c = self.config
        return Objectives(tighter(c.ttft_slo_ms, tier.ttft_slo_ms if tier else None),
                          tighter(c.tpot_slo_ms, tier.tpot_slo_ms if tier else None))

    @property
    def default_max_tokens(self) -> int:
        return int(getattr(self.engine, "default_max_tokens", 64))

    def check_capacity(self, priority: int = 0, chars: int = 0, max_tokens: int | None = None,
                       objectives: Objectives = NO_OBJECTIVES, arrived_at: float | None = None) -> Promise:
        """Before tokenising: refuse when too much already waits for the engine, or when the request's
        objectives are predicted to be missed (its prompt judged from its `chars`); otherwise reserve
        its place among the waiting, which `prompt_ids` moves on and `withdraw` gives back."""
        if not self.ready:
            raise self.not_ready()
        c = self.config
        waiting = self.waiting + self.preparing
        if waiting >= c.max_waiting_requests or self._waiting_tokens >= c.max_waiting_prompt_tokens:
            raise self._refuse(self._overloaded(waiting))
        now = time.monotonic()
        self._read_engine()
        promise = self.book.reserve(self.engine_request_id(), priority, now if arrived_at is None else arrived_at,
                                    self.costs.prompt_tokens(chars), max_tokens or self.default_max_tokens, objectives)
        self._check_objectives(promise, now)
        self.preparing += 1
        return promise

    def _check_objectives(self, promise: Promise, now: float) -> None:
        """Refuse `promise` (taking it out of the book) when it is predicted to miss an objective."""
        if promise.objectives.ttft_s is None and promise.objectives.tpot_s is None and not self.book.promised_ttft:
            return  # (nothing promised to anyone: the static bounds alone)
        prediction = promise.prediction = self.book.predict(promise.priority, promise.prompt_tokens, promise.max_tokens,
                                                            now, promise)
        refused = refusal(self.book, promise, prediction, now)
        if refused is not None:
            self.book.leave(promise, now, finished=False)
            raise self._refuse(refused)

    def not_ready(self) -> NotReady:  # (the 503 of a request it cannot take now: starting, or stopping)
        state = "stopping; retry on another instance" if self.stopping else "starting"
        return NotReady(f"model {self.name} is {state}", retry_after_ms=1000)

    def _read_engine(self) -> None:
        stats = self._stats
        self.book.places, self.book.kv_cache_tokens = stats.max_running, stats.kv_cache_tokens
        self.book.kv_block_tokens = stats.kv_block_tokens
        if self.book.kept_back:
            self._hand_over_released()

    def _refuse(self, error: ServiceOverloaded) -> ServiceOverloaded:
        self.metrics.refusals[error.reason] = self.metrics.refusals.get(error.reason, 0) + 1
        self.book.refused(time.monotonic())
        return error

    def withdraw(self, promise: Promise) -> None:
        """A request admitted that goes no further than its tokenising (refused, a bad field, a client
        gone): its place given back. Nothing once it was handed to the engine (`stream` ends it)."""
        if promise.submitted_at:
            return
        if not promise.tokenised:
            self.preparing -= 1
            promise.tokenised = True  # (given back once)
        self.book.leave(promise, time.monotonic(), finished=False)

    def _overloaded(self, waiting: int) -> ServiceOverloaded:
        return ServiceOverloaded(
            f"model {self.name} has {waiting} requests ({self._waiting_tokens} prompt tokens) waiting for the engine",
            retry_after_ms=self.retry_after_ms(),
            reason="queue_full",
        )

    @property
    def waiting(self) -> int:
        """Requests handed to the engine that have no first token yet."""
        return self.book.waiting - self.preparing

    @property
    def running(self) -> int:
        return len(self.book.running)

    @property
    def waiting_tokens(self) -> int:
        return self._waiting_tokens

    async def prompt_ids(self, promise: Promise, text: str | None = None, messages: Sequence[Mapping[str, Any]] | None = None,
                         tools: list[dict[str, Any]] | None = None, chars: int = 0) -> list[int]:
        """A prompt's token ids (a chat's, through its template), from the tokenizing thread: a long prompt
        never stalls the loop. Moves `promise` (from `check_capacity`) from tokenising to waiting: the
        caller hands the ids to `stream` with no await between, so the request is counted as waiting
        throughout. InvalidInput when it is empty or too long for the model; ServiceOverloaded when its
        tokens would take the waiting prompt tokens past their bound (unless nothing else waits), or
        miss its objectives now that they are known. Any failure withdraws the promise."""
        engine = self.engine
        assert engine is not None
        encode = partial(engine.encode_chat, messages, tools) if messages is not None else partial(engine.encode, text or "")
        try:
            try:
                ids = await self.loop.run_in_executor(self._tokenizing, encode)
            except ValueError as exc:  # (a chat its template refuses)
                raise InvalidInput(str(exc)) from None
            finally:
                self.preparing -= 1
                promise.tokenised = True
            if self._waiting_tokens and self._waiting_tokens + len(ids) > self.config.max_waiting_prompt_tokens:
                raise self._refuse(self._overloaded(self.waiting + self.preparing))
            if not ids:
                raise InvalidInput("the prompt is empty")
            if len(ids) >= engine.max_model_len:
                raise InvalidInput(f"prompt is {len(ids)} tokens; model {self.name} takes fewer than {engine.max_model_len}")
            now = time.monotonic()
            self.costs.observe_prompt(len(ids), chars, now)
            self.book.tokenised(promise, len(ids), promise.max_tokens)
            self._check_objectives(promise, now)
        except BaseException:
            self.withdraw(promise)
            raise
        return ids

    def tool_plan(self, body: dict[str, Any]) -> ToolPlan | None:
        """A chat request's `tools` and `tool_choice`, read as the engine reads them (vLLM's: as its own
        server does); None when it names none. InvalidInput where the engine refuses them."""
        if not self.ready or self.engine is None:
            raise self.not_ready()
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
        return retry_after_ms(mean * max(1, self.waiting))

    def capacity_scale(self) -> float:
        """The engine schedules its own batches; its rate limits are not scaled."""
        return 1.0

    # ---- generating ------------------------------------------------------------------------------

    def engine_request_id(self) -> str:
        """A request's id in the engine (the server's own, unique in this engine): what its trace names."""
        return f"{self.name}-{next(self._engine_ids)}"

    async def stream(self, prompt_ids: list[int], sampling: Any, promise: Promise,
                     adapter: Adapter | None = None) -> AsyncGenerator[Delta, None]:
        """Deltas for one request (through `adapter`, one of `adapters`, when given), accounted as
        waiting until its first token, then running; its figures teach the cost model."""
        assert self.engine is not None
        book = self.book
        started = time.monotonic()
        # (the prediction made once its tokens were known, with no await since; else one made now)
        prediction = promise.prediction if promise.prediction is not None else \
            book.predict(promise.priority, len(prompt_ids), promise.max_tokens, started, promise)
        book.submitted(promise, prediction, started)
        self._waiting_tokens += len(prompt_ids)
        self.metrics.prompt_tokens += len(prompt_ids)
        first_at = 0.0
        finished = False
        engine_deltas: AsyncIterator[Delta] | None = None
        try:
            if not book.hand_over(promise):  # (kept back until its KV need is free: see `EngineBook.hand_over`)
                await self._kept.setdefault(promise.request_id, self.loop.create_future())
            lora = adapter.engine_request if adapter is not None else None
            engine_deltas = self.engine.generate(prompt_ids, sampling, promise.request_id, promise.priority, lora)
            async for delta in engine_deltas:
                now = time.monotonic()
                if not first_at:
                    first_at = now
                    self._waiting_tokens -= len(prompt_ids)
                    book.first_token(promise, delta.token_count, now)
                    self.metrics.ttft.observe(now - promise.arrived_at)
                    if promise.predicted_ttft_s > 0:
                        self.metrics.ttft_prediction.observe((now - started) / promise.predicted_ttft_s)
                elif delta.token_count:
                    self.metrics.time_per_output_token.observe((now - promise.last_at) / delta.token_count)
                    book.tokens(promise, delta.token_count, now)
                self.metrics.output_tokens += delta.token_count
                if self.stopping and delta.finish_reason == "abort":  # (vLLM's shutdown ends what it runs so: see `stop`)
                    raise self.not_ready()
                finished = delta.done
                yield delta
        except InferdError:
            raise
        except Exception as exc:  # (an engine stopped under it: the model is going, a 503, not a failed generation)
            if self.ready:
                raise
            raise self.not_ready() from exc
        finally:
            close = getattr(engine_deltas, "aclose", None)  # (now, not when collected: closing aborts it in the engine)
            if close is not None:
                await close()
            if not first_at:
                self._waiting_tokens -= len(prompt_ids)
            self._kept.pop(promise.request_id, None)
            book.leave(promise, time.monotonic(), finished)
            self._hand_over_released()

    def _hand_over_released(self) -> None:
        """Those kept back whose KV need is free now go on to the engine."""
        for promise in self.book.released():
            handed = self._kept.get(promise.request_id)
            if handed is not None and not handed.done():
                handed.set_result(None)

    def record_abort(self, reason: str) -> None:
        self.metrics.aborts[reason] = self.metrics.aborts.get(reason, 0) + 1

    def snapshot(self, now: float) -> GenerationSnapshot:
        stats, m = self._stats, self.metrics
        return GenerationSnapshot(
            name=self.name, ready=self.ready, ttft=m.ttft, time_per_output_token=m.time_per_output_token,
            prompt_tokens=m.prompt_tokens, output_tokens=m.output_tokens, waiting=self.book.waiting, running=self.running,
            engine_waiting=stats.waiting, engine_running=stats.running, kv_cache_usage=stats.kv_cache_usage,
            aborts=dict(m.aborts), refusals=dict(m.refusals), preemptions=stats.preemptions,
            predicted_ttft_s=self.predicted_ttft_s(now), ttft_slo_s=self.config.ttft_slo_ms / 1000 if self.config.ttft_slo_ms else None,
            ttft_prediction=m.ttft_prediction, demand=self.book.demand(now), places=self._stats.max_running,
        )

    def predicted_ttft_s(self, now: float) -> float:
        """What a typical new request of the lowest priority would wait for its first token now, its
        margin included: what an autoscaler compares with the objective (0 before the model is ready)."""
        if not self.ready:
            return 0.0
        self._read_engine()
        lowest = max((p for p in self.book.priorities()), default=0)
        prediction = self.book.predict(lowest, self.costs.typical_prompt_tokens, self.default_max_tokens, now)
        return prediction.ttft_s + prediction.ttft_margin_s

    @property
    def _stats(self) -> EngineStats:
        return self.engine.stats if self.engine is not None else EngineStats()

    def describe(self) -> dict[str, Any]:
        stats = self._stats
        return {
            "id": self.name, "object": "model", "owned_by": "inferd", "name": self.name, "kind": self.kind, "ready": self.ready,
            **({"error": describe(self.start_error)} if self.start_error is not None else {}),
            "max_model_len": self.engine.max_model_len if self.engine is not None else None,
            "adapters": sorted(self.adapters.loaded),
            "max_waiting_requests": self.config.max_waiting_requests,
            "max_waiting_prompt_tokens": self.config.max_waiting_prompt_tokens,
            "ttft_slo_ms": self.config.ttft_slo_ms,
            "tpot_slo_ms": self.config.tpot_slo_ms,
            "costs": self.costs.describe(),
            "prediction_errors": {"ttft": self.book.ttft_errors.describe(), "tpot": self.book.tpot_errors.describe()},
            "stats": {
                "waiting": self.book.waiting, "kept_back": self.book.kept_back, "running": self.running,
                "engine_running": stats.running, "engine_waiting": stats.waiting, "kv_cache_usage": stats.kv_cache_usage,
                "preemptions": stats.preemptions,
                "output_tokens": self.metrics.output_tokens,
                "refusals": dict(self.metrics.refusals),
                "aborts": dict(self.metrics.aborts),
            },
        }
