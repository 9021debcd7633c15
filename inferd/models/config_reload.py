"""An edited config file applied while the server serves (SIGHUP), with the admin API's steps.

The admin API and the file are both sources of changes; a reload applies what changed *in the file*
since it was last applied (a version added, removed, or its model's configured split edited), so an
unchanged file never undoes what the admin API did. The whole file is checked first (backend modules
imported off the loop, their options, memory, conflicts): it is applied entirely or not at all.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from ..config import ConfigError, ModelConfig, ServerConfig
from ..errors import InferdError, ModelNotFound, VersionConflict
from .rollout import Rollouts, configured_traffic
from .versions import VersionState

log = logging.getLogger("inferd.rollout")


class ConfigReload:
    """The file's batch models as last applied, and what applying an edited one changes."""

    def __init__(self, rollouts: Rollouts, configs: list[ModelConfig]) -> None:
        self.rollouts = rollouts
        self._from_file = {(c.name, c.version): c for c in configs}

    async def apply(self, config: ServerConfig) -> list[str]:
        """Apply what changed in an edited config file's batch models since it was last applied (SIGHUP):
        load what it adds, set the split of each model whose configured split or versions it changed
        once those loads are done, then unload what it removed. Everything is checked first; a
        ConfigError (one line, every problem) leaves all as it was. Returns what will change, one line each."""
        rollouts, before = self.rollouts, self._from_file
        wanted = {(c.name, c.version): c for c in config.models if c.kind == "batch"}
        current = {(m.name, m.version) for m in rollouts.models.instances()}
        changes, loads, problems = [], [], []
        for key in sorted(before.keys() & wanted.keys()):
            if replace(before[key], traffic=None) != replace(wanted[key], traffic=None):
                changes.append(f"{key[0]}@{key[1]}: changed settings are not applied to a loaded version; give it a new version")
        for key in sorted(wanted.keys() - before.keys()):
            if key in current:
                changes.append(f"{key[0]}@{key[1]}: loaded already (through the admin API), kept as it is")
                continue
            try:
                await rollouts.check(wanted[key])
            except InferdError as exc:
                problems.append(f"{key[0]}@{key[1]}: {exc.message}")
                continue
            loads.append(wanted[key])
        if problems:
            raise ConfigError(*problems)
        if self._from_file is not before:
            raise ConfigError("another reload was applied meanwhile; send SIGHUP again")
        self._from_file = wanted
        for model in loads:
            try:
                rollouts.load(model)  # (its traffic is set below, with its model's, once every load is done)
            except InferdError as exc:  # (what changed during the checks' awaits: an admin load meanwhile)
                changes.append(f"{model.name}@{model.version}: not loaded: {exc.message}")
                continue
            changes.append(f"{model.name}@{model.version}: loading")
        gone = sorted(k for k in before.keys() - wanted.keys() if k in current)
        changes += [f"{name}@{version}: unloading once traffic has moved" for name, version in gone]
        resplit = [name for name in dict.fromkeys(n for n, _ in wanted)
                   if _split(before, name) != _split(wanted, name) or any(c.name == name for c in loads)]
        changes += [f"{name}: traffic as the file gives it, once loaded" for name in resplit]
        rollouts.follow(asyncio.get_running_loop().create_task(
            self._settle(wanted, resplit, [(c.name, c.version) for c in loads], gone)))
        return changes

    async def _settle(self, wanted: dict[tuple[str, str], ModelConfig], resplit: list[str],
                      loading: list[tuple[str, str]], gone: list[tuple[str, str]]) -> None:
        rollouts = self.rollouts
        while any(rollouts.state(n, v) is VersionState.LOADING for n, v in loading):
            await asyncio.sleep(0.02)
        for name in resplit:
            try:
                rollouts.set_traffic(name, _split(wanted, name))
            except (VersionConflict, ModelNotFound) as exc:
                log.error("config reload: model %s keeps its traffic: %s", name, exc.message)
        for name, version in gone:
            try:
                rollouts.unload(name, version, last_too=True)  # (the file says so: it no longer lists it)
            except (VersionConflict, ModelNotFound) as exc:
                log.error("config reload: %s@%s stays: %s", name, version, exc.message)


def _split(models: dict[tuple[str, str], ModelConfig], name: str) -> dict[str, float]:
    """The split a file gives a model (none when it does not list the model)."""
    mine = [c for (n, _), c in models.items() if n == name]
    return configured_traffic(mine) if mine else {}
