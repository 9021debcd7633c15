"""The models one server serves, by name: batch models with their versions (`versions.ServedModel`) and
generation models, the first configured name being the default. The set changes at run time (the admin
API, a config reload: `rollout`); routing reads it per request."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Any

from ..errors import InferdError, InvalidInput, ModelNotFound, NotReady
from ..observability.snapshots import BatchModelSnapshot, GenerationSnapshot
from .batch_model import BatchModel
from .versions import ServedModel, VersionState

if TYPE_CHECKING:
    from .adapters import Adapter
    from .generation import GenerationModel


class Models:
    """Every model of the server; `ready` when every model taking traffic can serve its default version."""

    def __init__(self, served: dict[str, ServedModel], generation: dict[str, GenerationModel], default: str) -> None:
        self.served = served
        self.generation = generation
        self.default = default

    @property
    def batch(self) -> dict[str, BatchModel]:
        """Each batch model's default version (or its only one), by name."""
        found = {}
        for name, served in self.served.items():
            default = served.default
            if default is not None:
                found[name] = served.versions[default].model
            elif served.versions:
                found[name] = next(iter(served.versions.values())).model
        return found

    def default_for(self, kind: str) -> str:
        """The model a call of `kind` ("embedding", "rerank") goes to when it names none (TEI's `/rerank`
        never does): the default model if it gives that kind, else the first (ready) one that does, else the
        default (whose answer then says what it is not, or that it is still warming up)."""
        batch = self.batch
        default = batch.get(self.default)
        if default is not None and default.output_kind == kind:
            return self.default
        return next((name for name, model in batch.items() if model.output_kind == kind), self.default)

    def not_found(self, name: str, wanted: str = "model") -> ModelNotFound:
        """The 404 of a route that found no `wanted` (e.g. "embedding model") named `name`: saying what
        the name is, where it is something else (a generation model named on an embedding route)."""
        holder = self.holder(name)
        if holder is None:
            return ModelNotFound(f"no {wanted} named {name!r}; see GET /v1/models")
        article = "" if holder.startswith("an ") else "a "
        return ModelNotFound(f"{name!r} names {article}{holder}, and this route takes {wanted}s only; see GET /v1/models")

    def holder(self, name: str) -> str | None:
        """What answers to `name` now, if anything: a batch model, a generation model, or an adapter of
        one (loaded, or still unloading: its name is not free yet). A request names any of them as its
        `model`, so a name is one thing's at a time."""
        if name in self.served:
            return f"batch model {name}"
        if name in self.generation:
            return f"generation model {name}"
        for model in self.generation.values():
            if name in model.adapters.names:
                return f"an adapter of model {model.name}"
        return None

    def route(self, spec: str, version: str | None = None) -> BatchModel | None:
        """The batch model version a request for `spec` (`name` or `name@version`) goes to; None when no
        batch model has that name. Raises ModelNotFound for a version it does not have."""
        name, version = _split(spec, version, "version")
        served = self.served.get(name)
        if served is None:
            return None
        if version is None and not served.traffic and any(v.state is VersionState.LOADING for v in served.versions.values()):
            raise NotReady(f"model {name} is loading", retry_after_ms=1000)
        return served.pick(version)

    def route_generation(self, spec: str, adapter: str | None = None) -> tuple[GenerationModel, Adapter | None] | None:
        """The generation model (and LoRA adapter) a request for `spec` goes to: `name`, `name@adapter`
        (or `adapter` given apart), or an adapter's own name, as vLLM's server takes it. None when no
        generation model answers to it; ModelNotFound for an adapter its model does not have."""
        name, adapter = _split(spec, adapter, "adapter")
        model = self.generation.get(name)
        if model is not None:
            return model, model.adapters.pick() if adapter is None else model.adapters.get(adapter)
        if adapter is None:
            for model in self.generation.values():
                if name in model.adapters.loaded:
                    return model, model.adapters.loaded[name]
        return None

    def adapter_entries(self) -> list[dict[str, Any]]:
        """Every generation model's adapters, as `GET /v1/models` lists them (each with its `parent`)."""
        return [entry for model in self.generation.values() for entry in model.adapters.describe()]

    def __getitem__(self, spec: str) -> BatchModel | GenerationModel:
        name, at, version = spec.partition("@")
        if name in self.served:
            return self.served[name].versions[version].model if at else self.batch[name]
        return self.generation[name]

    def instances(self) -> list[BatchModel]:
        """Every batch model version holding workers."""
        return [m for served in self.served.values() for m in served.models()]

    def all(self) -> list[BatchModel | GenerationModel]:
        return [*self.instances(), *self.generation.values()]

    @property
    def ready(self) -> bool:
        """Every model can serve (what /readyz says); a host serving no model at all is not ready."""
        return bool(self.served or self.generation) and all(s.ready for s in self.served.values()) and all(
            g.ready for g in self.generation.values())

    def failed(self) -> list[BatchModel | GenerationModel]:
        """Models that never came up (versions marked failed included)."""
        versions: list[BatchModel | GenerationModel] = [v.model for served in self.served.values()
                                                        for v in served.versions.values()]
        return [m for m in (*versions, *self.generation.values()) if m.start_error is not None]

    def start(self) -> None:
        for model in self.all():
            model.start()

    async def stop(self, reason: InferdError) -> None:
        await asyncio.gather(*(m.stop(reason) for m in self.instances()), *(g.stop() for g in self.generation.values()))

    def snapshots(self, now: float) -> tuple[list[BatchModelSnapshot], list[GenerationSnapshot]]:
        return [m.snapshot(now) for m in self.instances()], [g.snapshot(now) for g in self.generation.values()]


def _split(spec: str, given: str | None, what: str) -> tuple[str, str | None]:
    """`name@x` into the name and x (a version, an adapter), which must agree with one given apart."""
    name, at, named = spec.partition("@")
    if not at:
        return name, given
    if given is not None and given != named:
        raise InvalidInput(f"`model` says {what} {named!r} and `version` says {given!r}")
    return name, named
