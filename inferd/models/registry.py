"""The models one server serves, by name: batch models and generation models, the first configured
being the default."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING

from ..errors import InferdError
from ..observability.snapshots import BatchModelSnapshot, GenerationSnapshot
from .batch_model import BatchModel

if TYPE_CHECKING:
    from .generation import GenerationModel


class Models:
    """Every model of the server; `ready` when every one of them is."""

    def __init__(self, batch: dict[str, BatchModel], generation: dict[str, GenerationModel], default: str) -> None:
        self.batch = batch
        self.generation = generation
        self.default = default

    def __getitem__(self, name: str) -> BatchModel | GenerationModel:
        model = self.batch.get(name)
        return model if model is not None else self.generation[name]

    def all(self) -> list[BatchModel | GenerationModel]:
        return [*self.batch.values(), *self.generation.values()]

    @property
    def ready(self) -> bool:
        return all(m.ready for m in self.all())

    def failed(self) -> list[BatchModel | GenerationModel]:
        return [m for m in self.all() if m.start_error is not None]

    def start(self) -> None:
        for model in self.all():
            model.start()

    async def stop(self, reason: InferdError) -> None:
        await asyncio.gather(*(m.stop(reason) for m in self.batch.values()), *(g.stop() for g in self.generation.values()))

    def snapshots(self, now: float) -> tuple[list[BatchModelSnapshot], list[GenerationSnapshot]]:
        return [m.snapshot(now) for m in self.batch.values()], [g.snapshot(now) for g in self.generation.values()]
