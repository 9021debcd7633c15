"""The process's phase (starting, serving, draining) and the count of requests it still owes an answer."""

from __future__ import annotations

import asyncio
from enum import Enum


class Phase(Enum):
    """Where the process stands between start and exit."""

    STARTING = "starting"
    SERVING = "serving"
    LAME_DUCK = "lame_duck"  # after SIGTERM: not ready (health checks notice), still serving
    DRAINING = "draining"  # new requests refused; admitted ones finish


class Lifecycle:
    """The process phase and the requests still owed an answer (a drain waits for them)."""

    def __init__(self) -> None:
        self.phase = Phase.STARTING
        self.in_flight = 0  # requests inside a handler: admitted or being admitted
        self._idle = asyncio.Event()
        self._idle.set()

    @property
    def draining(self) -> bool:
        return self.phase is Phase.DRAINING

    @property
    def serving(self) -> bool:
        """Should load balancers send traffic here (readiness)?"""
        return self.phase is Phase.SERVING

    def enter(self) -> None:
        self.in_flight += 1
        if self.in_flight == 1:
            self._idle.clear()

    def leave(self) -> None:
        self.in_flight -= 1
        if not self.in_flight:
            self._idle.set()

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight; False if `timeout_s` passed first."""
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
            return True
        except TimeoutError:
            return False
