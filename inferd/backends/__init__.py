"""Backends: the model side, a batch function `fn(inputs: list) -> list` of the same length, and what
it may offer beside (the contract: `contract.py`).

A config names one as "package.module:name". The object found there is either
- a batch function, called as it is by every worker (the seed's `batchstring` shape), or
- a factory, marked with `@backend_factory` (or `factory = true` in config), called once per worker
  thread as `factory(device, options)` so each worker builds its own model on its own GPU.

"package.module" alone means that module's `create` factory.

A generation model's backend builds an engine instead (`build_engine`; the contract's
`GenerationEngine`).
"""

from __future__ import annotations

import importlib
import threading
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple, TypeVar

from .contract import (  # noqa: F401 - the contract, re-exported
    BatchBackend,
    Capabilities,
    Delta,
    EngineStats,
    GenerationEngine,
    TokenLogprob,
    ToolPlan,
    module_check_options,
    module_memory_bytes,
)
from .hooks import protocol_members

BackendFactory = Callable[[str, Mapping[str, Any]], BatchBackend]
T = TypeVar("T")

_FACTORY_MARK = "__inferd_factory__"

BUILDING = threading.Lock()
"""Held while one backend is built (a factory's call, a generation engine's start), so that no two
threads build at once in this process. Why: libraries that import their parts lazily on first use
(transformers' `AutoModel`, accelerate under peft) are not safe to touch from two threads at once:
two models built together failed every time with `cannot import name 'AutoModel'`. Process-wide
because what it guards is: the interpreter's modules. Building alone costs a multi-worker start the
overlap of constructing its models; warm-up, the long part, still runs side by side."""


class Prepared(NamedTuple):
    """One input as the backend will take it, from `prepare_batch`."""

    input: Any
    bucket: int = 0  # batches never mix buckets
    tokens: int = 0  # its size in tokens, where that means something (usage counts)


def built_alone(build: Callable[[], T]) -> T:
    """`build()` with `BUILDING` held: for what imports a backend's libraries outside a worker's build
    (a generation engine's start, an admin load's import check)."""
    with BUILDING:
        return build()


def backend_factory(fn: BackendFactory) -> BackendFactory:
    """Mark `fn(device, options) -> batch function` as a per-worker factory."""
    setattr(fn, _FACTORY_MARK, True)
    return fn


def resolve_backend(spec: str) -> Any:
    """Import the object a config's `backend` names."""
    module_name, _, attr = spec.partition(":")
    module = importlib.import_module(module_name)
    name = attr or "create"
    try:
        obj = module
        for part in name.split("."):
            obj = getattr(obj, part)
    except AttributeError:
        raise ImportError(f"backend {spec!r}: {module_name} has no attribute {name!r}") from None
    if not callable(obj):
        raise TypeError(f"backend {spec!r} is not callable")
    return obj


def is_factory(obj: Any, configured: bool | None) -> bool:
    return configured if configured is not None else bool(getattr(obj, _FACTORY_MARK, False))


def build_batch_function(
    spec: str, device: str, options: Mapping[str, Any], factory: bool | None = None
) -> BatchBackend:
    """What one worker calls: the factory's product for its device (built alone: `BUILDING`), or the
    plain function itself."""
    with BUILDING:  # (importing the module is a build's first step, and may be the racing one)
        obj = resolve_backend(spec)
    if is_factory(obj, factory):
        with BUILDING:
            fn = obj(device, options)
        if not callable(fn):
            raise TypeError(f"backend factory {spec!r} returned a non-callable {type(fn).__name__}")
        return fn
    return obj


_ENGINE_MEMBERS = protocol_members(GenerationEngine)  # (what build_engine checks an engine has: the protocol's own)


def build_engine(spec: str, options: Mapping[str, Any], adapters: int = 0) -> GenerationEngine:
    """A generation model's engine, not started: what `spec` names (a module alone: its `create`) called as
    `(options, adapters)`, `adapters` being how many LoRA adapters the model is configured with. ValueError
    for options it refuses; TypeError, naming what is missing, for an object that is no engine."""
    with BUILDING:
        make = resolve_backend(spec)
    engine = make(options, adapters)
    missing = [name for name in _ENGINE_MEMBERS if not hasattr(engine, name)]
    if missing:
        raise TypeError(f"backend {spec!r} built a {type(engine).__name__}, which is no generation engine: it lacks "
                        f"{', '.join(missing)}")
    return engine
