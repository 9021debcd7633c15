"""One served model name: its versions, each a batch model of its own (own queue, own workers, so a
batch never mixes versions), their states, and the split of requests that name no version.

A request names `model` alone (the split: a weighted draw among the versions that take traffic and
have a healthy worker; with one such version, no draw at all), or pins one (`model@version`, or the
`version` field). A version is loading (its workers build and warm beside the others; pinned requests
get 503 NOT_READY, the split never picks it), ready, draining (being unloaded: pinned requests get
404, admitted ones finish), unloaded, or failed (with the reason; it never served). An unloaded version
(and a failed one, once deleted) lets go of its model, scheduler, workers and timers: what is kept of it
is a line in a short history (`retired`).
"""

from __future__ import annotations

import random
import time
from collections import deque
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING

from ..errors import ModelNotFound

if TYPE_CHECKING:
    from .batch_model import BatchModel


class VersionState(Enum):
    LOADING = "loading"
    READY = "ready"
    DRAINING = "draining"
    UNLOADED = "unloaded"
    FAILED = "failed"


@dataclass(eq=False)
class Version:
    model: BatchModel
    state: VersionState = VersionState.LOADING
    reason: str | None = None  # why it failed
    since: float = field(default_factory=time.time)  # when it entered its state (wall clock, for the admin view)

    def enter(self, state: VersionState, reason: str | None = None) -> None:
        self.state, self.reason, self.since = state, reason, time.time()


@dataclass(frozen=True)
class RetiredVersion:
    """What is kept of a version that is gone: a line for the admin view, nothing it held."""

    version: str
    state: VersionState
    reason: str | None
    since: float
    backend: str


RETIRED_KEPT = 16  # the history's length, per model name


class ServedModel:
    """A model name's versions and its traffic split."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.versions: dict[str, Version] = {}
        self.retired: deque[RetiredVersion] = deque(maxlen=RETIRED_KEPT)
        self.traffic: dict[str, float] = {}  # version -> share (summing to 1), for requests that name no version
        self._only: BatchModel | None = None  # the one version taking traffic, when there is one
        self._draw = random.random

    def add(self, model: BatchModel, state: VersionState = VersionState.LOADING) -> Version:
        version = self.versions[model.version] = Version(model, state)
        model.takes_traffic = model.version in self.traffic
        return version

    def retire(self, version: str) -> None:
        """Forget a version that is gone (unloaded, or failed and deleted): keep a line of history."""
        found = self.versions.pop(version)
        self.retired.append(RetiredVersion(version, found.state, found.reason, found.since, found.model.config.backend))

    def set_traffic(self, weights: dict[str, float]) -> None:
        """The split from weights (not necessarily summing to 1), kept as shares that do: what every view
        shows, whatever weights were given. Versions with weight 0 take none."""
        total = sum(w for w in weights.values() if w > 0)
        self.traffic = {v: round(w / total, 6) for v, w in weights.items() if w > 0}
        for version, found in self.versions.items():
            found.model.takes_traffic = version in self.traffic
        self._only = self.versions[next(iter(self.traffic))].model if len(self.traffic) == 1 else None

    @property
    def default(self) -> str | None:
        """The version taking the largest share (the first such, on a tie); None when none takes traffic."""
        return max(self.traffic, key=self.traffic.__getitem__) if self.traffic else None

    @property
    def ready(self) -> bool:
        """Its default version can serve (what /readyz asks of every model); a model still loading its first
        version is not held against the host, one whose versions all failed is."""
        default = self.default
        if default is None:
            return any(v.state is VersionState.LOADING for v in self.versions.values())
        return self.versions[default].model.ready

    def pick(self, version: str | None = None) -> BatchModel:
        """The version a request goes to (see the module's docstring)."""
        if version is None:
            only = self._only
            if only is not None:
                return only
            return self._split()
        found = self.versions.get(version)
        if found is None or found.state in (VersionState.UNLOADED, VersionState.FAILED):
            raise ModelNotFound(f"model {self.name} has no version {version!r}; see GET /v1/models")
        if found.state is VersionState.DRAINING:
            raise ModelNotFound(f"version {version} of model {self.name} is being unloaded")
        return found.model

    def _split(self) -> BatchModel:
        weights = [(v, w) for v, w in self.traffic.items() if self.versions[v].model.ready]
        if not weights:  # none can serve now: the default, whose admission answers 503 honestly
            default = self.default
            if default is None:
                raise ModelNotFound(f"model {self.name} has no version taking traffic")
            return self.versions[default].model
        point = self._draw() * sum(w for _, w in weights)
        for version, weight in weights:
            point -= weight
            if point < 0:
                return self.versions[version].model
        return self.versions[weights[-1][0]].model

    def models(self) -> list[BatchModel]:
        """Every version's model still holding workers (not unloaded or failed)."""
        return [v.model for v in self.versions.values() if v.state not in (VersionState.UNLOADED, VersionState.FAILED)]
