"""The flags a `vllm serve`, Text Embeddings Inference or Infinity user types, read onto `inferd serve --model`'s
config: the model as vLLM takes it (positional) or TEI (`--model-id`), its name, its context length,
dtype, batch limits, the engine's own settings and the gRPC port, each landing on the config key that
means the same (`--print-config` shows where). A flag of theirs with no counterpart here is refused
with the key to set instead, never ignored: a server that silently drops `--max-num-seqs` serves with
another limit than the one asked for.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..typed_tables import ConfigError

_DTYPES = {"half": "float16", "float16": "float16", "bfloat16": "bfloat16", "float": "float32", "float32": "float32"}


@dataclass(frozen=True)
class Borrowed:
    """One flag of theirs: whose it is, where it lands per model task (`model.KEY`: the [[models]] table,
    `option.KEY`: its options, `engine.KEY`: a generation model's `engine_args`), and its values' type."""

    flag: str
    whose: str
    encoder: str | None  # where it lands for an embedding, rerank, classify or image model (None: not theirs)
    generate: str | None  # ... for a generation model
    parse: Callable[[str], Any] = int


def _dtype(value: str) -> str | None:
    if value == "auto":
        return None  # (the model's own: the backend's default)
    if value not in _DTYPES:
        raise argparse.ArgumentTypeError(f"one of auto, {', '.join(_DTYPES)}")
    return _DTYPES[value]


BORROWED = (
    Borrowed("--served-model-name", "vLLM's and TEI's", "model.name", "model.name", str),
    Borrowed("--max-model-len", "vLLM's", "option.max_tokens", "option.max_model_len"),
    Borrowed("--dtype", "vLLM's and TEI's", "option.dtype", "option.dtype", _dtype),
    Borrowed("--max-num-seqs", "vLLM's", None, "option.max_num_seqs"),
    Borrowed("--gpu-memory-utilization", "vLLM's", None, "engine.gpu_memory_utilization", float),
    Borrowed("--tensor-parallel-size", "vLLM's", None, "engine.tensor_parallel_size"),
    Borrowed("--max-batch-tokens", "TEI's", "model.max_batch_tokens", None),
    Borrowed("--max-batch-requests", "TEI's", "model.max_batch_size", None),
    Borrowed("--max-client-batch-size", "TEI's", "model.max_inputs_per_call", None),
    Borrowed("--max-concurrent-requests", "TEI's", "model.max_queue", "model.max_waiting_requests"),
    Borrowed("--batch-size", "Infinity's", "model.max_batch_size", None),
)
# Theirs with no flag here: what to set instead.
ELSEWHERE = {
    "--pooling": "the text backend pools by the mean (task = \"embedding\"); no other pooling is served",
    "--revision": "a local folder or a Hub snapshot already in the cache (--model PATH)",
    "--tokenization-workers": "one tokenising thread per model (the Rust tokeniser batches inside)",
    "--payload-limit": "[server] max_body_bytes",
    "--max-num-batched-tokens": "[models.options.engine_args] max_num_batched_tokens (a generation model)",
    "--enable-prefix-caching": "[models.options.engine_args] enable_prefix_caching",
    "--chat-template": "[models.options.engine_args] chat_template (vLLM reads the folder's own by default)",
    "--prometheus-port": "GET /metrics on the serving port",
    "--otlp-endpoint": "[tracing] endpoint",
    "--json-output": "the access log is JSON lines already ([server] access_log)",
    "--uds-path": "[server] host and port (TCP only)",
    "--url-prefix": "the Infinity routes are served without /v1, OpenAI's and Cohere's with it",
}


def add_borrowed_flags(serve: argparse.ArgumentParser) -> None:
    """Their flags on `inferd serve` (with `--model` or the positional model)."""
    serve.add_argument("model_or_folder", nargs="?", metavar="MODEL", help="as `vllm serve MODEL`: the same as --model")
    serve.add_argument("--model-id", action="append", dest="model_id", metavar="MODEL", help="as TEI's: --model")
    serve.add_argument("--hostname", help="as TEI's: --host")
    serve.add_argument("--grpc-port", type=int, help="override [server] grpc_port (the Open Inference Protocol over gRPC)")
    serve.add_argument("--auto-truncate", action="store_true", help="as TEI's: inputs over the length are cut "
                       "(inferd's default already: option truncate)")
    for b in BORROWED:
        lands = " / ".join(f"{kind}: {key}" for kind, key in (("encoders", b.encoder), ("generation", b.generate)) if key)
        serve.add_argument(b.flag, type=b.parse, help=f"as {b.whose}, for the first model: {lands}")


def borrowed_models(args: argparse.Namespace) -> list[str]:
    """The models given as vLLM or TEI give them, after any `--model`."""
    return [*(args.model or []), *([args.model_or_folder] if args.model_or_folder else []), *(args.model_id or [])]


def borrowed_settings(args: argparse.Namespace, task: str) -> dict[str, dict[str, Any]]:
    """For a model of `task`: {"model": {...}, "option": {...}, "engine": {...}} from their flags given.
    ConfigError for one that has no meaning for that task."""
    settings: dict[str, dict[str, Any]] = {"model": {}, "option": {}, "engine": {}}
    for b in BORROWED:
        value = getattr(args, b.flag[2:].replace("-", "_"))
        if value is None:
            continue
        lands = b.generate if task == "generate" else b.encoder
        if lands is None:
            raise ConfigError(f"{b.flag} ({b.whose}) is for {'a generation model' if b.generate else 'an encoder'}; "
                              f"this model's task is {task}")
        where, _, key = lands.partition(".")
        settings[where][key] = value
    if args.auto_truncate and task != "generate":
        settings["option"]["truncate"] = True
    settings["option"] = {k: v for k, v in settings["option"].items() if v is not None}  # (--dtype auto)
    return settings


def refuse_unknown(parser: argparse.ArgumentParser, extra: list[str], command: str) -> None:
    """Exit with argparse's error for flags no parser took; for `serve`, saying where theirs go instead."""
    if not extra:
        return
    if command != "serve":
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    hint = ELSEWHERE.get(extra[0].partition("=")[0])
    parser.error(f"unrecognized argument {extra[0]}" + (f": in inferd, {hint}" if hint else "") +
                 "; `inferd serve --model DIR --print-config` shows the config it serves, every key there to change")
