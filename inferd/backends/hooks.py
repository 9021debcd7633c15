"""The backend contract's optional hooks (the table in `contract`) as small protocols: a backend class
that lists the ones it keeps among its bases has their signatures checked by a type checker. At run
time `Capabilities.of` reads the hooks a backend has, listed or not: the names in `HOOKS`, read from
these protocols (one place to add a hook: a protocol here, and its field in `Capabilities`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol


class PreparesBatches(Protocol):
    def prepare_batch(self, items: Sequence[Any], /) -> list[Any]: ...


class PreparesOne(Protocol):
    def prepare(self, text: str, /) -> tuple[Any, ...]: ...


class ChecksCalls(Protocol):
    def check_call(self, items: Sequence[Any], /) -> None: ...


class WarmsUp(Protocol):
    def warmup(self) -> Mapping[str, Any] | None: ...


class WarmsUpByBucket(Protocol):
    def warmup_batches(self) -> list[list[Any]]: ...


class KnowsItsCosts(Protocol):
    def cost(self, batch_size: int, bucket: int, /) -> float | None: ...


class Closes(Protocol):
    def close(self) -> None: ...


class Pipelined(Protocol):
    def launch(self, inputs: list[Any], /) -> Any: ...

    def collect(self, handle: Any, /) -> Sequence[Any]: ...


class ShowsTokens(Protocol):
    def tokens_of(self, texts: Sequence[str], add_special_tokens: bool, /) -> list[list[dict[str, Any]]]: ...

    def text_of(self, id_lists: Sequence[Sequence[int]], skip_special_tokens: bool, /) -> list[str]: ...


def protocol_members(protocol: type) -> tuple[str, ...]:
    """The names a protocol declares (its attributes, then its methods), in their order: what an object
    keeping it must have, read from the protocol itself."""
    names = [*getattr(protocol, "__annotations__", {})]
    names += [name for name, value in vars(protocol).items() if not name.startswith("_") and callable(value)]
    return tuple(dict.fromkeys(names))


HOOK_PROTOCOLS = (PreparesBatches, PreparesOne, ChecksCalls, WarmsUp, WarmsUpByBucket, KnowsItsCosts, Closes, Pipelined,
                  ShowsTokens)
HOOKS = tuple(name for protocol in HOOK_PROTOCOLS for name in protocol_members(protocol))
