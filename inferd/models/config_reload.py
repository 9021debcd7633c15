"""An edited config file applied while the server serves (SIGHUP), with the admin API's steps.

The admin API and the file are both sources of changes; a reload applies what changed *in the file*
since it was last applied (a version added, removed, or its model's configured split edited), so an
unchanged file never undoes what the admin API did. The whole file is checked first (backend modules
imported off the loop, their options, memory, conflicts): it is applied entirely or not at all.

A reload never takes a model away that the file still lists: a version the file removed is unloaded
only once another version of its model is ready and takes its traffic (a replacement that fails to
build leaves the old one serving, with an error logged). The split waits for every version the file
lists that is still loading, the admin API's loads included. A reload that comes while an earlier
one is still settling takes over what that one had left to do, as the newer file has it. Where the
server and its file disagree once a reload has settled (an admin load or unload, a version kept for
want of its replacement), a warning says so, and `GET /v1/admin/models` shows it (`file_drift`).
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import replace

from ..config import ConfigError, ModelConfig, ServerConfig
from ..errors import InferdError, ModelNotFound, VersionConflict
from .rollout import GONE, Rollouts, configured_traffic
from .versions import VersionState

log = logging.getLogger("inferd.rollout")


class ConfigReload:
    """The file's batch models as last applied, and what applying an edited one changes."""

    def __init__(self, rollouts: Rollouts, configs: list[ModelConfig]) -> None:
        self.rollouts = rollouts
        self._from_file = {(c.name, c.version): c for c in configs}
        self._settling: asyncio.Task | None = None
        self._left: tuple[set[str], set[tuple[str, str]]] = (set(), set())  # what a settling reload has still to do

    async def apply(self, config: ServerConfig) -> list[str]:
        """Apply what changed in an edited config file's batch models since it was last applied (SIGHUP):
        load what it adds, set the split of each model whose configured split or versions it changed
        once its listed versions are loaded, then unload what it removed (see the module docstring).
        Everything is checked first; a ConfigError (one line, every problem) leaves all as it was.
        Returns what will change, one line each."""
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
        gone = {k for k in before.keys() - wanted.keys() if k in current}
        changes += [f"{name}@{version}: unloading once traffic has moved" for name, version in sorted(gone)]
        resplit = {name for name in dict.fromkeys(n for n, _ in wanted)
                   if _split(before, name) != _split(wanted, name) or any(c.name == name for c in loads)}
        changes += [f"{name}: traffic as the file gives it, once loaded" for name in sorted(resplit)]
        if self._settling is not None and not self._settling.done():  # an earlier reload still settling: its
            self._settling.cancel()  # work left is this one's now, as this file has it
            resplit |= {name for name in self._left[0] if any(n == name for n, _ in wanted)}
            gone |= self._left[1]
        gone -= wanted.keys()
        self._left = (resplit, gone)
        self._settling = asyncio.get_running_loop().create_task(self._settle(wanted, resplit, gone))
        rollouts.follow(self._settling)
        return changes

    async def _settle(self, wanted: dict[tuple[str, str], ModelConfig], resplit: set[str],
                      gone: set[tuple[str, str]]) -> None:
        rollouts = self.rollouts
        while any(rollouts.state(n, v) is VersionState.LOADING for n, v in wanted):  # (an admin API's load too)
            await asyncio.sleep(0.02)
        for name in sorted(resplit):
            try:
                rollouts.set_traffic(name, _split(wanted, name))
            except (VersionConflict, ModelNotFound) as exc:
                log.error("config reload: model %s keeps its traffic: %s", name, exc.message)
        listed = {n for n, _ in wanted}
        for name, version in sorted(gone):
            try:  # a model the file still lists keeps its last serving version until another takes its traffic
                rollouts.unload(name, version, last_too=name not in listed)
            except (VersionConflict, ModelNotFound) as exc:
                log.error("config reload: %s@%s stays: %s", name, version, exc.message)
        self._left = (set(), set())
        drift = self.drift()
        if drift:
            log.warning("config reload: the server and its file differ: %s", drift)

    def drift(self) -> dict[str, dict[str, list[str]]]:
        """Each batch model whose versions (loading, ready or draining) differ from those its file lists:
        what the file lists and what the server has."""
        served = self.rollouts.models.served
        listed: dict[str, list[str]] = {}
        for name, version in self._from_file:
            listed.setdefault(name, []).append(version)
        drift = {}
        for name in sorted(listed.keys() | served.keys()):
            found = served.get(name)
            have = sorted(v for v, f in found.versions.items() if f.state not in GONE) if found is not None else []
            if sorted(listed.get(name, [])) != have:
                drift[name] = {"file": sorted(listed.get(name, [])), "server": have}
        return drift


def _split(models: dict[tuple[str, str], ModelConfig], name: str) -> dict[str, float]:
    """The split a file gives a model (none when it does not list the model)."""
    mine = [c for (n, _), c in models.items() if n == name]
    return configured_traffic(mine) if mine else {}
