"""A generation model's LoRA adapters: loaded into its engine (at start, or by the admin API), named by
requests as their `model` (or `model@adapter`), counted while requests use them, and unloaded only once
the last of those has finished, so an unload under load loses nothing: from the moment it is asked, new
requests for the adapter get a 404, and the ones already admitted run to their end through it."""

from __future__ import annotations

import asyncio
import itertools
import logging
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..backends import GenerationEngine
from ..errors import InvalidInput, ModelNotFound, VersionConflict, describe

log = logging.getLogger("inferd.generation")


@dataclass(eq=False)
class Adapter:
    """One loaded adapter: its id and handle in the engine (vLLM's `LoRARequest`), and the requests using
    it now."""

    name: str
    path: str
    pinned: bool
    engine_id: int
    engine_request: Any
    running: int = 0
    idle: asyncio.Event = field(default_factory=asyncio.Event)  # set while no request uses it

    def __post_init__(self) -> None:
        self.idle.set()

    def enter(self) -> None:
        self.running += 1
        self.idle.clear()

    def leave(self) -> None:
        self.running -= 1
        if not self.running:
            self.idle.set()

    def describe(self, model: str) -> dict[str, Any]:
        return {"id": self.name, "object": "model", "owned_by": "inferd", "parent": model, "kind": "adapter",
                "root": self.path, "pinned": self.pinned, "running": self.running}


class Adapters:
    """The adapters of one model's engine, by name."""

    def __init__(self, model: str, engine: GenerationEngine | None) -> None:
        self.model = model
        self.engine = engine
        self.loaded: dict[str, Adapter] = {}
        self._ids = itertools.count(1)  # the engine's adapter ids: unique per engine, never reused
        self._names_taken: set[str] = set()  # loaded or still unloading: a name is free again once it is gone
        self.unloading: set[asyncio.Task] = set()  # (held: the loop keeps only weak references to tasks)
        self.traffic: dict[str, float] = {}  # requests naming the model itself, split: {model or adapter: weight}
        self._random = random.Random()

    @property
    def names(self) -> frozenset[str]:
        """The names its adapters hold: loaded, or still unloading."""
        return frozenset(self._names_taken)

    def get(self, name: str) -> Adapter:
        """The adapter a request names; ModelNotFound (404) when it has none by that name."""
        adapter = self.loaded.get(name)
        if adapter is None:
            raise ModelNotFound(f"model {self.model} has no adapter {name!r}; see GET /v1/models")
        return adapter

    async def load(self, name: str, path: str, pinned: bool = False) -> Adapter:
        engine = self.engine
        if engine is None or not engine.lora_enabled:
            raise VersionConflict(f"model {self.model} was started without LoRA: configure [[models.adapters]] or "
                           "`engine_args.enable_lora = true`")
        if name in self._names_taken or name == self.model:
            raise VersionConflict(f"model {self.model} already has an adapter (or itself) named {name!r}")
        if len(self._names_taken) >= engine.adapter_room:  # (those still unloading hold their slot too)
            raise VersionConflict(f"model {self.model} holds {engine.adapter_room} adapters at most "
                                  "(`engine_args.max_loras`); unload one first")
        if not Path(path).is_dir():
            raise InvalidInput(f"adapter {name!r}: {path!r} is not a folder (adapter_config.json and its weights)")
        self._names_taken.add(name)
        try:
            engine_id = next(self._ids)
            request = await engine.add_adapter(name, engine_id, path, pinned)
        except Exception as exc:  # noqa: BLE001 - the adapter's files or shape are at fault: the caller's 400
            self._names_taken.discard(name)
            raise InvalidInput(f"adapter {name!r} cannot be loaded: {describe(exc)}") from None
        adapter = self.loaded[name] = Adapter(name, path, pinned, engine_id, request)
        log.info("model %s: adapter %s loaded from %s", self.model, name, path)
        return adapter

    def set_traffic(self, weights: dict[str, float]) -> None:
        """How requests that name the model itself are split between it (its own name) and its adapters
        (e.g. a canary of a fine-tune); {} or the model alone: all to the model."""
        for name, weight in weights.items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 <= weight < float("inf"):
                raise InvalidInput(f"traffic weights are numbers >= 0, got {weight!r} for {name}")
            if name != self.model and name not in self.loaded:
                raise VersionConflict(f"model {self.model} has no adapter {name!r} loaded to take traffic")
        if not 0 < sum(weights.values()) < float("inf"):  # (1e308 twice is inf: every share NaN)
            raise InvalidInput("traffic weights must add up to more than 0, and not overflow")
        self.traffic = {name: float(w) for name, w in weights.items() if w > 0}
        log.info("model %s traffic: %s", self.model, self.traffic)

    def pick(self) -> Adapter | None:
        """Where a request naming the model itself goes: the model (None) or an adapter, by `traffic`."""
        if not self.traffic:
            return None
        name = self._random.choices(list(self.traffic), weights=list(self.traffic.values()))[0]
        return self.loaded.get(name)

    def unload(self, name: str) -> asyncio.Task:
        """Stop admitting requests for the adapter now (its share of the traffic goes back to the others,
        or to the model); the returned task removes it from the engine once the requests using it have
        finished."""
        adapter = self.get(name)
        del self.loaded[name]
        self.traffic.pop(name, None)
        if self.traffic and not sum(self.traffic.values()) > 0:
            self.traffic = {}
        task = asyncio.get_running_loop().create_task(self._remove(adapter), name=f"unload-{self.model}-{name}")
        self.unloading.add(task)
        task.add_done_callback(self.unloading.discard)
        return task

    async def _remove(self, adapter: Adapter) -> None:
        await adapter.idle.wait()
        try:
            if self.engine is not None:
                await self.engine.remove_adapter(adapter.engine_id)
        finally:
            self._names_taken.discard(adapter.name)
        log.info("model %s: adapter %s unloaded", self.model, adapter.name)

    def describe(self) -> list[dict[str, Any]]:
        return [adapter.describe(self.model) for adapter in self.loaded.values()]
