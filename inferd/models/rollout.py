"""Model versions changed while the server serves: load one beside the running ones, move traffic, drain
and unload one (the admin API's steps, and an edited config file's: `config_reload`).

- *Load*: checked against free memory first (`memory`), then the version's own workers build and warm
  up in their threads while the others serve; it takes traffic only once ready (a new model name then
  gets all of its traffic; a new version of a model only what it is given). A load that fails leaves the
  serving versions as they were, and says why (`failed`, with the reason).
- *Traffic*: a split over ready versions; requests that pin a version are not part of it.
- *Unload*: the version leaves the split at once (its pinned requests get 404), what was admitted to it
  finishes (within `grace_s`), then its workers stop and its memory is let go.
"""

from __future__ import annotations

import asyncio
import gc
import importlib
import logging
import sys
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from ..backends import built_alone, module_check_options
from ..config import ModelConfig
from ..errors import Draining, InvalidInput, ModelNotFound, VersionConflict, describe
from .batch_model import BatchModel
from .memory import check_fits, cuda_free_after_build
from .registry import Models
from .versions import ServedModel, Version, VersionState

log = logging.getLogger("inferd.rollout")
GONE = (VersionState.UNLOADED, VersionState.FAILED)


def configured_traffic(configs: list[ModelConfig]) -> dict[str, float]:
    """The split a config file asks for: the versions' `traffic`, or all of it to the first version listed."""
    if any(c.traffic is not None for c in configs):
        return {c.version: c.traffic or 0.0 for c in configs}
    return {configs[0].version: 1.0}


class Rollouts:
    """The run-time changes to one server's batch models."""

    def __init__(self, models: Models, build: Callable[[ModelConfig], BatchModel], headroom_bytes: int,
                 grace_s: float = 30.0) -> None:
        self.models = models
        self.build = build
        self.headroom_bytes = headroom_bytes
        self.grace_s = grace_s
        self._tasks: set[asyncio.Task] = set()

    def add_configured(self, configs: list[ModelConfig]) -> None:
        """The versions in the config file at start-up: built with the server, the split as configured."""
        for name in dict.fromkeys(c.name for c in configs):
            mine = [c for c in configs if c.name == name]
            served = self.models.served[name] = ServedModel(name)
            for config in mine:
                self._watch(served, served.add(self.build(config)), None, check_memory=False)
            served.set_traffic(configured_traffic(mine))

    # ---- load ------------------------------------------------------------------------------------

    def load(self, config: ModelConfig, traffic_when_ready: dict[str, float] | None = None) -> Version:
        """Start loading a version (see the module's docstring); `traffic_when_ready`: the split to set once
        it is ready (default: none for a new version of a model, all of it for a new model)."""
        self._check_conflicts(config)
        check_fits(config, self.headroom_bytes)
        served = self.models.served.get(config.name)
        if served is None:
            served = self.models.served[config.name] = ServedModel(config.name)
            traffic_when_ready = traffic_when_ready or {config.version: 1.0}
        model = self.build(config)
        version = served.add(model)
        model.start()
        log.info("loading model %s version %s", config.name, config.version)
        self._watch(served, version, traffic_when_ready)
        return version

    async def check(self, config: ModelConfig) -> None:
        """What `load` will check, then the backend: its module imported and its options checked, off the
        loop (importing torch takes seconds). InvalidInput naming what is wrong."""
        self._check_conflicts(config)
        module = config.backend.partition(":")[0]
        loop = asyncio.get_running_loop()
        try:
            await loop.run_in_executor(None, built_alone, partial(importlib.import_module, module))
        except Exception as exc:  # noqa: BLE001 - ImportError, or whatever the module raised while importing
            raise InvalidInput(f"backend module {module!r} does not import: {describe(exc)}") from None
        try:
            await loop.run_in_executor(None, module_check_options, config.backend, config.options)
        except ValueError as exc:
            raise InvalidInput(f"backend {config.backend!r}: {describe(exc)}") from None
        check_fits(config, self.headroom_bytes)

    def _check_conflicts(self, config: ModelConfig) -> None:
        served = self.models.served.get(config.name)
        current = served.versions.get(config.version) if served is not None else None
        if current is not None and current.state not in GONE:
            raise VersionConflict(f"model {config.name} version {config.version} is {current.state.value} already")
        if config.kind != "batch" or config.name in self.models.generation:
            raise VersionConflict("only batch models are loaded at run time; generation models need a restart")
        holder = self.models.holder(config.name) if served is None else None
        if holder is not None:  # (an adapter's name: requests for it would go to one or the other)
            raise VersionConflict(f"the name {config.name!r} is taken by {holder}")

    def _watch(self, served: ServedModel, version: Version, traffic: dict[str, float] | None,
               check_memory: bool = True) -> None:
        self.follow(asyncio.get_running_loop().create_task(self._until_ready(served, version, traffic, check_memory)))

    async def _until_ready(self, served: ServedModel, version: Version, traffic: dict[str, float] | None,
                           check_memory: bool) -> None:
        model = version.model
        while not model.ready and model.start_error is None and version.state is VersionState.LOADING:
            await asyncio.sleep(0.02)
        if version.state is not VersionState.LOADING:
            return  # unloaded meanwhile
        free = cuda_free_after_build(model.config) if check_memory and model.start_error is None else None
        if free is not None and free < self.headroom_bytes:
            reason = f"built, it left {free >> 20} MiB of CUDA memory free, under the {self.headroom_bytes >> 20} MiB headroom"
        elif model.start_error is not None:
            reason = describe(model.start_error)
        else:
            reason = None
        if reason is not None:
            version.enter(VersionState.FAILED, reason)
            served.set_traffic({v: w for v, w in served.traffic.items() if v != model.version})  # (it takes none)
            log.error("model %s version %s failed to load: %s", served.name, model.version, reason)
            await model.stop(Draining("this model version failed to load"))
            model.pool.release()
            _release_memory()
            return
        version.enter(VersionState.READY)
        log.info("model %s version %s ready", served.name, model.version)
        if traffic:
            self.set_traffic(served.name, traffic)
        elif not served.traffic:  # nothing else takes its model's traffic (the others failed): it takes it all
            self.set_traffic(served.name, {model.version: 1.0})

    # ---- traffic ---------------------------------------------------------------------------------

    def set_traffic(self, name: str, weights: dict[str, float]) -> None:
        served = self._served(name)
        for version, weight in weights.items():
            if not isinstance(weight, (int, float)) or isinstance(weight, bool) or not 0 <= weight < float("inf"):
                raise InvalidInput(f"traffic weights are numbers >= 0, got {weight!r} for version {version}")
        if not 0 < sum(weights.values()) < float("inf"):  # (1e308 twice is inf: every share NaN)
            raise InvalidInput("traffic weights must add up to more than 0, and not overflow")
        for version, weight in weights.items():
            found = served.versions.get(version)
            if weight > 0 and (found is None or found.state is not VersionState.READY):
                state = found.state.value if found is not None else "not loaded"
                raise VersionConflict(f"model {name} version {version} is {state}: only ready versions take traffic")
        served.set_traffic(weights)
        log.info("model %s traffic: %s", name, served.traffic)

    # ---- unload ----------------------------------------------------------------------------------

    def unload(self, name: str, version: str, last_too: bool = False) -> Version:
        """Take a version out of the split now and unload it once what it admitted is answered. The
        model's last serving version only when `last_too` says so (the name goes with it, and requests for
        it get 404): otherwise VersionConflict."""
        served = self._served(name)
        found = served.versions.get(version)
        if found is not None and found.state is VersionState.FAILED:
            served.retire(version)  # (it never served and holds nothing: deleting it is forgetting it)
            return found
        if found is None or found.state in GONE:
            raise ModelNotFound(f"model {name} has no version {version!r} loaded")
        if found.state is VersionState.DRAINING:
            return found
        rest = {v: w for v, w in served.traffic.items() if v != version}
        others = [v for v, f in served.versions.items() if v != version and f.state is VersionState.READY]
        if not last_too and not any(v != version and f.state not in GONE for v, f in served.versions.items()):
            raise VersionConflict(f"version {version} is model {name}'s last: unloading it removes the model "
                                  "(say so with ?last=true)")
        if version in served.traffic and not rest and others:
            raise VersionConflict(f"version {version} takes all of model {name}'s traffic: give it to {others} first")
        found.enter(VersionState.DRAINING)
        served.set_traffic(rest)
        log.info("model %s version %s draining", name, version)
        self.follow(asyncio.get_running_loop().create_task(self._drain(served, found)))
        return found

    async def _drain(self, served: ServedModel, version: Version) -> None:
        model = version.model
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.grace_s
        while not _idle(model) and loop.time() < give_up:
            await asyncio.sleep(0.01)
        await model.stop(Draining("this model version was unloaded before the request ran; retry", retry_after_ms=100))
        model.metrics.retired[(model.name, model.version)] = model.snapshot(time.monotonic())  # (its counters stay)
        model.pool.release()
        model.shared.cache = None  # (what it computed goes too)
        version.enter(VersionState.UNLOADED)
        served.retire(model.version)  # (its model, scheduler, workers and timers go with it)
        if all(v.state in GONE for v in served.versions.values()):
            self.models.served.pop(served.name, None)  # the name is gone with its last version
        _release_memory()
        log.info("model %s version %s unloaded", served.name, model.version)

    def follow(self, task: asyncio.Task) -> None:
        """Keep a task of a rollout's until it is done (and cancel it at `close`)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def state(self, name: str, version: str) -> VersionState | None:
        served = self.models.served.get(name)
        found = served.versions.get(version) if served is not None else None
        return found.state if found is not None else None

    def _served(self, name: str) -> ServedModel:
        served = self.models.served.get(name)
        if served is None:
            raise ModelNotFound(f"no batch model named {name!r}")
        return served

    async def close(self) -> None:
        """Stop following loads and drains (the server is stopping every model anyway)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    def describe(self) -> dict[str, Any]:
        """Each model's versions, their states and the split (the admin view)."""
        return {name: {"default": served.default, "traffic": served.traffic, "versions": {
            version: {"state": v.state.value, "since": round(v.since, 3), "reason": v.reason, "ready": v.model.ready,
                      "ready_workers": v.model.pool.healthy, "backend": v.model.config.backend}
            for version, v in served.versions.items()}, "retired": [
            {"version": r.version, "state": r.state.value, "since": round(r.since, 3), "reason": r.reason, "backend": r.backend}
            for r in served.retired]} for name, served in self.models.served.items()}


def _idle(model: BatchModel) -> bool:
    """Nothing it admitted is still being prepared, waiting or computing."""
    preprocessor = model.preprocessor
    return not model.batcher.depth and not model.pool.running() and (preprocessor is None or preprocessor.idle)


def _release_memory() -> None:
    """What an unloaded version held goes back: Python's objects now, and CUDA's cached blocks."""
    gc.collect()
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.empty_cache()
