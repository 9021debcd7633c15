"""The backend contract: the one surface code outside inferd implements, read once when a worker builds
a backend, never probed again on the request path.

A backend is a batch function: called with a list of inputs, it returns one output per input, in order
(`BatchBackend`). Everything else is optional, and what a backend offers is checked when it is built
(`Capabilities.of`): a hook that is not callable fails the model's start with a message naming it,
instead of being silently skipped.

| optional | what inferd does with it |
|---|---|
| `prepare_batch(items) -> [Prepared or Exception]` | runs it off the event loop, on the model's preprocessing thread, for micro-batches of arriving inputs: each becomes (input, length bucket, tokens); an Exception answers that input alone with a 400 |
| `prepare(text) -> (input, bucket[, tokens])` | the same for one input, on the event loop: cheap pure-Python bucketing only (`prepare_batch` wins when both exist) |
| `warmup() -> dict` | runs it before the worker is ready (e.g. CUDA graph capture); the dict is shown in `GET /v1/models` |
| `warmup_batches() -> [batch per length bucket]` | runs each before the worker is ready, then times each bucket's at 1, 2, 4... inputs: the cost model's first figures |
| `cost(batch_size, bucket) -> seconds or None` | the cost model's first figures instead of timing them (e.g. timed CUDA graphs) |
| `check_call(items)` | runs it on the event loop for a call of several inputs before any is prepared: it raises (PayloadTooLarge: 413, ValueError: 400) to refuse the whole call; cheap checks only (the image backend adds up the images' sizes from their headers against `max_call_pixels`) |
| `close()` | called when the worker lets go of the backend (a version unloaded), to free what it holds |
| `tokens_of(texts, add_special_tokens) -> [[token]]` and `text_of(id_lists, skip_special_tokens) -> [str]` | a text model's tokeniser, shown: TEI's `POST /tokenize` (each token a dict: `id`, `text`, `special`, `start`, `stop`) and `POST /decode` (ValueError: a 400); called off the event loop, beside the preparing thread, so thread-safe |
| `launch(inputs) -> handle` and `collect(handle) -> outputs` (both or neither) | a batch in two steps, so the device never waits for the host: `launch` does the host's part (padding, pinned copies) and queues the device's work without waiting for it; `collect` waits for it and returns one output per input. The worker launches the next batch while one computes (a full batch only), and collects them in order: one batch computes at a time, as the device runs its queue in order |
| `prepare_threads` | how many threads run `prepare_batch` at once (default 1): more only where preparing costs per input and runs outside the GIL (an image decoder); a tokenizer that is parallel inside needs one |
| `prepare_max_batch` | the most inputs one `prepare_batch` call takes (default 256): small where an input costs milliseconds (an image decoder: 8), so inputs whose client went away are dropped between calls and tenants take turns |
| `prepare_nice` | how many nice levels below the event loop its preparing threads run (default 0; `[server] worker_nice` when that is more): bulk CPU work such as image decoding, which should take what the loop leaves |
| `execute_nice` | how many nice levels below the event loop its executor thread runs once it is built (default 0; `[server] worker_nice` when that is more), and the threads it starts from then on, such as PyTorch's CPU pool at the warm-up's first forward: a forward computed on the CPU, which should take what the loop leaves |
| `output_kind` | `"embedding"`: `/v1/embeddings` may serve the model; `"rerank"`: `/v1/rerank` |
| `input_kind` | what one input is: `"text"` (the default; token ids too), `"image"` (bytes, or `{"image": base64}` with the base64 a str or, lifted from a large JSON body, ASCII bytes) or `"pair"` (a (query, document) pair); the HTTP routes refuse another kind with a 400 |
| `compatibility` | a dict of what changes the computation besides the model and version (shown as the batch key) |
| `embedding_sizes`, `normalized` | an embedding model's: the sizes `dimensions` may cut its vectors to (a list: a Matryoshka model's trained sizes; an int: any size up to it; absent: `dimensions` is refused), and whether its vectors are unit-length (a cut one is then normalised again) |
| `token_embeddings` | an embedding model's: True where an input wrapped as `messages.EveryToken` is answered with each of its tokens' vectors, a (tokens, width) array (TEI's `/embed_all`; refused with a 400 elsewhere) |
| `buckets_by_length` | True where the buckets are input lengths in increasing order and an input may run in any higher bucket's batch (only padded more), as a tokenised text's: a small multi-input call's inputs then queue together in its longest input's bucket, served in one batch instead of one per bucket |

Beside the factory, a backend module may define `memory_bytes(options) -> int`: one worker's need, for
the memory check before a version is loaded (`module_memory_bytes`); and `check_options(options)`,
raising ValueError for options it would refuse, so `inferd check-config`, an admin load and a reload
find a misspelt option or a missing model folder without building anything (`module_check_options`).

A generation model (`kind = "generation"`) is served by an engine that batches per token step itself
(`GenerationEngine`): its backend module's `create(options, adapters)` builds it (`build_engine`), and
`memory_bytes` and `check_options` serve as above. vLLM's is `vllm.py`; `echo_engine.py`, which echoes
prompts back without a model, is the smallest one, and what the generation routes' tests run on.
"""

from __future__ import annotations

import importlib
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar, runtime_checkable

from .hooks import HOOKS

In = TypeVar("In")
Out = TypeVar("Out", covariant=True)


@runtime_checkable
class BatchBackend(Protocol[In, Out]):
    """The one thing a backend must be: a batch function, one output per input, in order (`In`: what
    one prepared input is, e.g. token ids; `Out`: one output, e.g. a vector). Bare, it is
    `BatchBackend[Any, Any]`. The optional hooks below, as protocols a backend class may list: `hooks`."""

    def __call__(self, inputs: list[In], /) -> Sequence[Out]: ...


INPUT_KINDS = ("text", "image", "pair")


@dataclass(frozen=True)
class Capabilities:
    """What a built backend offers beyond being called: each hook bound, or None where it has none."""

    prepare_batch: Callable[[Sequence[Any]], list[Any]] | None = None
    prepare: Callable[[str], tuple[Any, ...]] | None = None
    check_call: Callable[[Sequence[Any]], None] | None = None
    warmup: Callable[[], Mapping[str, Any] | None] | None = None
    warmup_batches: Callable[[], list[list[Any]]] | None = None
    cost: Callable[[int, int], float | None] | None = None
    close: Callable[[], None] | None = None
    launch: Callable[[list[Any]], Any] | None = None
    collect: Callable[[Any], Sequence[Any]] | None = None
    tokens_of: Callable[[Sequence[str], bool], list[list[dict[str, Any]]]] | None = None
    text_of: Callable[[Sequence[Sequence[int]], bool], list[str]] | None = None
    output_kind: str | None = None
    input_kind: str = "text"
    compatibility: Mapping[str, Any] = field(default_factory=dict)
    prepare_threads: int = 1
    prepare_max_batch: int = 256
    prepare_nice: int = 0
    execute_nice: int = 0
    buckets_by_length: bool = False
    embedding_sizes: int | tuple[int, ...] | None = None
    normalized: bool = False
    token_embeddings: bool = False

    @classmethod
    def of(cls, backend: Any) -> Capabilities:
        """Read what `backend` offers, once; raise TypeError, naming the attribute, for anything that does
        not keep the contract."""
        if not callable(backend):
            raise TypeError(f"a backend must be callable (a batch function), not {type(backend).__name__}")
        hooks = {}
        for name in HOOKS:
            hook = getattr(backend, name, None)
            if hook is not None and not callable(hook):
                raise TypeError(f"backend {type(backend).__name__}: `{name}` must be a method, not {type(hook).__name__}")
            hooks[name] = hook
        if (hooks["launch"] is None) != (hooks["collect"] is None):
            raise TypeError(f"backend {type(backend).__name__}: `launch` and `collect` come together")
        kind = getattr(backend, "output_kind", None)
        if kind is not None and not isinstance(kind, str):
            raise TypeError(f"backend {type(backend).__name__}: `output_kind` must be a string")
        input_kind = getattr(backend, "input_kind", None) or "text"
        if input_kind not in INPUT_KINDS:
            raise TypeError(f"backend {type(backend).__name__}: `input_kind` must be one of {', '.join(INPUT_KINDS)}")
        compatibility = getattr(backend, "compatibility", None) or {}
        if not isinstance(compatibility, Mapping):
            raise TypeError(f"backend {type(backend).__name__}: `compatibility` must be a dict")
        threads = getattr(backend, "prepare_threads", 1)
        most = getattr(backend, "prepare_max_batch", 256)
        for name, value in (("prepare_threads", threads), ("prepare_max_batch", most)):
            if type(value) is not int or value < 1:
                raise TypeError(f"backend {type(backend).__name__}: `{name}` must be a positive integer")
        nice = {name: getattr(backend, name, 0) for name in ("prepare_nice", "execute_nice")}
        for name, value in nice.items():
            if type(value) is not int or value < 0:
                raise TypeError(f"backend {type(backend).__name__}: `{name}` must be a non-negative integer")
        by_length = getattr(backend, "buckets_by_length", False)
        if type(by_length) is not bool:
            raise TypeError(f"backend {type(backend).__name__}: `buckets_by_length` must be True or False")
        sizes = getattr(backend, "embedding_sizes", None)
        if isinstance(sizes, (list, tuple)):
            sizes = tuple(sizes)
        if sizes is not None and not (type(sizes) is int and sizes > 0 or isinstance(sizes, tuple) and sizes
                                      and all(type(n) is int and n > 0 for n in sizes)):
            raise TypeError(f"backend {type(backend).__name__}: `embedding_sizes` must be a positive integer or a list of them")
        normalized, token_embeddings = getattr(backend, "normalized", False), getattr(backend, "token_embeddings", False)
        for name, flag in (("normalized", normalized), ("token_embeddings", token_embeddings)):
            if type(flag) is not bool:
                raise TypeError(f"backend {type(backend).__name__}: `{name}` must be True or False")
        return cls(**hooks, output_kind=kind, input_kind=input_kind, compatibility=dict(compatibility),
                   prepare_threads=threads, prepare_max_batch=most, prepare_nice=nice["prepare_nice"],
                   execute_nice=nice["execute_nice"], buckets_by_length=by_length, embedding_sizes=sizes,
                   normalized=normalized, token_embeddings=token_embeddings)


def module_memory_bytes(spec: str, options: Mapping[str, Any]) -> int:
    """One worker's memory need, as the backend module named by `spec` estimates it (0: no estimate).
    Imports the module: call it off the event loop."""
    module = importlib.import_module(spec.partition(":")[0])
    estimate = getattr(module, "memory_bytes", None)
    return int(estimate(options)) if estimate is not None else 0


def module_check_options(spec: str, options: Mapping[str, Any]) -> None:
    """Raise ValueError for options the backend module named by `spec` would refuse (nothing when it has
    no `check_options`). Imports the module: call it off the event loop."""
    module = importlib.import_module(spec.partition(":")[0])
    check = getattr(module, "check_options", None)
    if check is not None:
        check(options)


# ---- generation engines ----------------------------------------------------------------------------


@dataclass
class EngineStats:
    """A generation engine's latest scheduler figures (for /metrics and /v1/models)."""

    running: int = 0
    waiting: int = 0
    kv_cache_usage: float = 0.0
    preemptions: int = 0  # sequences the engine has preempted (their KV cache taken back), since it started
    max_running: int = 0  # the most sequences it runs at once (vLLM's max_num_seqs; 0: not known)
    kv_cache_tokens: int = 0  # tokens its KV cache holds (0: not known)
    kv_block_tokens: int = 0  # tokens a block of its KV cache holds, the unit a sequence is given (0: not known)


@dataclass(slots=True)
class TokenLogprob:
    """One generated token's log probability, and the most likely tokens at its place (best first)."""

    token: str
    logprob: float
    top: list[tuple[str, float]]


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
    token_ids: Sequence[int] = ()  # the new tokens (what a tool parser reads beside the text)


class ToolPlan(Protocol):
    """What a chat request asked of its tools, and how its output is read back (an engine's
    `tool_plan`)."""

    choice: str  # none | auto | required | named
    tools: list[dict[str, Any]]  # as the client gave them (for the chat template)
    schema: dict[str, Any] | None  # the structured output a forced choice is held to
    name: str | None  # the function a named choice forces
    keep_special_tokens: bool  # the output must keep the tokens the tokenizer calls special

    @property
    def forced(self) -> bool: ...

    @property
    def reads_calls(self) -> bool: ...

    def stream(self, index: int, text: str, token_ids: Sequence[int],
               finished: bool) -> tuple[str | None, list[dict[str, Any]]]: ...

    def read(self, text: str) -> tuple[str | None, list[dict[str, Any]]]: ...

    def finish_reason(self, reason: str | None, called: bool) -> str | None: ...


@runtime_checkable
class GenerationEngine(Protocol):
    """What a `kind = "generation"` model's backend builds: an engine that batches per token step by
    itself. Built by the backend module's `create(options, adapters)` (or the callable the config
    names), started once off the event loop; everything else runs on the event loop."""

    max_model_len: int  # prompts of this many tokens or more are refused
    default_max_tokens: int  # a request's output tokens when it does not say
    stats: EngineStats
    lora_enabled: bool  # whether adapters may be loaded
    adapter_room: int  # how many adapters it holds at once

    def start(self) -> None:
        """Load the model (seconds; in a thread)."""

    def shutdown(self) -> None: ...

    def preload(self) -> None:
        """Import what a request's first use of a feature would (tool parsers); in a thread, after start."""

    def encode(self, text: str) -> list[int]: ...

    def encode_chat(self, messages: Sequence[Mapping[str, Any]], tools: list[dict[str, Any]] | None = None) -> list[int]:
        """A chat's prompt ids through the model's chat template; ValueError for messages the template refuses."""

    def tool_plan(self, body: dict[str, Any]) -> ToolPlan | None:
        """A chat request's tools (None when it names none); ValueError for tools it would refuse."""

    def sampling(self, overrides: Mapping[str, Any]) -> Any:
        """The engine's own sampling record for a request's fields; raises for fields it refuses."""

    def generate(self, prompt_ids: list[int], sampling: Any, request_id: str, priority: int,
                 adapter: Any = None) -> AsyncIterator[Delta]:
        """Deltas as they are made; closing the iterator early aborts the request in the engine."""

    async def add_adapter(self, name: str, adapter_id: int, path: str, pinned: bool) -> Any:
        """Load a LoRA adapter; the handle `generate` takes as `adapter`."""

    async def remove_adapter(self, adapter_id: int) -> None: ...

    def client_mistake(self, error: BaseException) -> bool:
        """Whether the engine refused a request for the request's own sake (a 400, never a 500)."""
