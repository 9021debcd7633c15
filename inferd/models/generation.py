"""A served generation model: admission and accounting around a vLLM engine.

The engine batches per token step by itself; what inferd adds is the same admission rules as for
batch models (auth, tiers as engine priorities, rate limits) plus bounds of its own on what waits for
the engine: requests that have not produced a first token yet, and their prompt tokens. Those bounds
are checked before any tokenising, so an overloaded server refuses cheaply (503 with retry_after_ms).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from ..backends.vllm import Delta, VllmEngine
from ..config import ModelConfig
from ..errors import NotReady, ServiceOverloaded, retry_after_ms
from ..observability.histogram import Histogram
from ..observability.snapshots import GenerationSnapshot

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
    """A vLLM engine in the server's loop, with inferd's bounds on what waits for it."""

    kind = "generation"

    def __init__(self, config: ModelConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.config = config
        self.name = config.name
        self.loop = loop
        self.engine = VllmEngine(config.options)
        self.metrics = GenerationMetrics()
        self.ready = False
        self.start_error: BaseException | None = None
        self.waiting: dict[str, int] = {}  # request id -> prompt tokens, until its first token
        self.running = 0
        self._waiting_tokens = 0
        self._start_task: asyncio.Task | None = None

    def start(self) -> None:
        self._start_task = self.loop.create_task(self._start(), name=f"engine-{self.name}")

    async def _start(self) -> None:
        try:
            await self.loop.run_in_executor(None, self.engine.start)  # seconds: keep /healthz answering
            warm = self.engine.sampling({"max_tokens": 2, "seed": 0})
            async for _ in self.engine.generate(self.engine.encode("warm up"), warm, f"warmup-{self.name}", 0):
                pass
            self.ready = True
            log.info("generation model %s ready", self.name)
        except Exception as exc:  # noqa: BLE001 - reported by /readyz
            log.exception("generation model %s failed to start", self.name)
            self.start_error = exc

    async def stop(self) -> None:
        if self._start_task is not None and not self._start_task.done():
            await asyncio.gather(self._start_task, return_exceptions=True)
        await self.loop.run_in_executor(None, self.engine.shutdown)

    # ---- admission -------------------------------------------------------------------------------

    def check_capacity(self) -> None:
        """Before tokenising: refuse when too much already waits for the engine."""
        if not self.ready:
            raise NotReady(f"model {self.name} is starting", retry_after_ms=1000)
        c = self.config
        if len(self.waiting) >= c.max_waiting_requests or self._waiting_tokens >= c.max_waiting_prompt_tokens:
            raise ServiceOverloaded(
                f"model {self.name} has {len(self.waiting)} requests ({self._waiting_tokens} prompt tokens) "
                "waiting for the engine",
                retry_after_ms=self.retry_after_ms(),
                reason="queue_full",
            )

    def retry_after_ms(self) -> int:
        """About the time the waiting requests take to reach their first token, from recent TTFTs."""
        mean = self.metrics.ttft.mean or 0.1
        return retry_after_ms(mean * max(1, len(self.waiting)))

    def capacity_scale(self) -> float:
        """The engine schedules its own batches; its rate limits are not scaled."""
        return 1.0

    # ---- generating ------------------------------------------------------------------------------

    async def stream(self, request_id: str, prompt_ids: list[int], sampling: Any, priority: int) -> AsyncIterator[Delta]:
        """Deltas for one request, accounted as waiting until its first token, then running."""
        started = time.monotonic()
        self.waiting[request_id] = len(prompt_ids)
        self._waiting_tokens += len(prompt_ids)
        self.metrics.prompt_tokens += len(prompt_ids)
        first_at = last_at = 0.0
        tokens = 0
        try:
            async for delta in self.engine.generate(prompt_ids, sampling, request_id, priority):
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
        stats, m = self.engine.stats, self.metrics
        return GenerationSnapshot(
            name=self.name, ready=self.ready, ttft=m.ttft, time_per_output_token=m.time_per_output_token,
            prompt_tokens=m.prompt_tokens, output_tokens=m.output_tokens, waiting=len(self.waiting), running=self.running,
            engine_waiting=stats.waiting, engine_running=stats.running, kv_cache_usage=stats.kv_cache_usage,
            aborts=dict(m.aborts),
        )

    def describe(self) -> dict[str, Any]:
        stats = self.engine.stats
        return {
            "id": self.name,
            "object": "model",
            "owned_by": "inferd",
            "name": self.name,
            "kind": self.kind,
            "ready": self.ready,
            "max_model_len": self.engine.max_model_len,
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
