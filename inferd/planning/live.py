"""A live fleet on this machine: `inferd serve` processes (the simulated GPU) behind HAProxy, scaled by
Kubernetes' HPA arithmetic on what their /metrics say: the live counterpart of `fleet`, to check the
simulator against (`benchmarks/scenarios/autoscaling.py --live`, tests/e2e/test_live_fleet.py).

The scaler is the simulator's: every `sample_s` it reads each ready replica's /metrics into a `Sample`
(the requests each answered or refused since the last one, summed into the arrival rate; the requests
waiting; the worst predicted wait), and every `poll_s` the policy's signals, read off those samples
`lag_s` behind as Prometheus would have them, go through `hpa.Hpa`. A replica asked for is started at
once and put in HAProxy's rotation `start_s` after the ask (the weights and warm-up a GPU pod takes),
once its /readyz answers; one removed leaves the rotation (no new requests) and gets SIGTERM (inferd
answers what it holds, then exits). HAProxy balances by least connections, as the simulator's balancer;
with no replica in rotation it answers 503 (`haproxy`). GPU time counts from the ask to the removal.
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import aiohttp

from .fleet import FleetResult
from .haproxy import Balancer
from .hpa import Hpa, HpaSettings
from .plan import PlanSettings
from .policies import Policy
from .replica import Outcome
from .scaling import Sample, Scaling
from .traces import Arrival


@dataclass
class LiveSettings:
    model: PlanSettings = field(default_factory=PlanSettings)
    start_s: float = 20.0
    sample_s: float = 5.0  # (the shipped Prometheus scrape interval, and the simulator's)
    max_replicas: int = 4  # HAProxy's slots (the policy's own maximum still applies)
    initial_replicas: int = 1


def _model_toml(settings: PlanSettings, port: int) -> str:
    return f"""[server]
host = "127.0.0.1"
port = {port}
grace_period_s = 10

[[models]]
name = "m"
backend = "inferd.backends.sim:create"
max_batch_size = {settings.max_batch_size}
max_wait_ms = {settings.max_wait_ms}
max_queue = 100000
timeout_ms = {int(settings.timeout_ms)}
slo_ms = {settings.slo_ms}
[models.options]
latency_ms = {settings.latency_ms}
per_item_ms = {settings.per_item_ms}
max_batch_size = {settings.max_batch_size}
"""


class _WallClock:
    def __init__(self) -> None:
        self.began = time.monotonic()

    @property
    def now(self) -> float:
        return time.monotonic() - self.began


@dataclass
class _LiveReplica:
    slot: int
    port: int
    asked: float
    process: subprocess.Popen
    ready_at: float | None = None
    removed: float | None = None
    counted_total: float = 0.0  # inferd_requests_total at the last sample


class LiveFleet(Scaling):
    """The fleet (see the module docstring); `async with` it, then `run` a trace."""

    hpa_settings: HpaSettings

    def __init__(self, settings: LiveSettings, policy: Policy, workdir: Path) -> None:
        self.settings = settings
        self.start_s, self.max_replicas = settings.start_s, settings.max_replicas
        self.policy = policy
        self.hpa_settings = policy.hpa
        self.hpa = Hpa(policy.hpa)
        self.workdir = workdir
        self.clock = _WallClock()
        self.samples: list[Sample] = []
        self.arrived_total = 0.0  # what the ready replicas' inferd_requests_total rose by, summed
        self._replicas: list[_LiveReplica] = []
        self.balancer = Balancer(settings.max_replicas, workdir)
        self._replicas_over_time: list[tuple[float, int]] = []
        self._scale_events = 0
        self._session: aiohttp.ClientSession | None = None
        self.failures: list[str] = []  # answers that were neither a result nor a refusal (none expected)
        self._bringing_up: set[asyncio.Task] = set()

    async def __aenter__(self) -> LiveFleet:
        self.workdir.mkdir(parents=True, exist_ok=True)
        await self.balancer.__aenter__()
        self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0))
        return self

    async def __aexit__(self, *exc: object) -> None:
        for task in list(self._bringing_up):
            task.cancel()
        for replica in self._replicas:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGTERM)
        for replica in self._replicas:
            try:
                replica.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                replica.process.kill()
        await self.balancer.__aexit__(*exc)
        if self._session is not None:
            await self._session.close()

    # ---- replicas --------------------------------------------------------------------------------

    @property
    def counted(self) -> list[_LiveReplica]:
        return [r for r in self._replicas if r.removed is None]

    @property
    def ready(self) -> list[_LiveReplica]:
        return [r for r in self.counted if r.ready_at is not None]

    def _add(self, start_s: float) -> None:
        busy = {r.slot for r in self.counted} | {r.slot for r in self._replicas if r.process.poll() is None}
        free = [slot for slot in range(len(self.balancer.ports)) if slot not in busy]
        if not free:
            return  # (every slot taken: the fleet's size is capped by its slots)
        slot = free[0]
        config = self.workdir / f"replica{slot}.toml"
        config.write_text(_model_toml(self.settings.model, self.balancer.ports[slot]))
        log = open(self.workdir / f"replica{slot}.log", "a")  # noqa: SIM115 - the process owns it
        process = subprocess.Popen([sys.executable, "-m", "inferd", "serve", "--config", str(config), "--log-level", "warning"],
                                   stdout=log, stderr=subprocess.STDOUT)
        replica = _LiveReplica(slot, self.balancer.ports[slot], self.clock.now, process)
        self._replicas.append(replica)
        bringing_up = asyncio.get_running_loop().create_task(self._bring_up(replica, start_s))
        self._bringing_up.add(bringing_up)  # (held: the loop keeps only a weak reference to a task)
        bringing_up.add_done_callback(self._bringing_up.discard)

    async def _bring_up(self, replica: _LiveReplica, start_s: float) -> None:
        await asyncio.sleep(max(0.0, replica.asked + start_s - self.clock.now))
        assert self._session is not None
        while replica.removed is None:
            try:
                async with self._session.get(f"http://127.0.0.1:{replica.port}/readyz") as resp:
                    if resp.status == 200:
                        break
            except aiohttp.ClientError:
                if replica.process.poll() is not None:  # (it will never be ready: say so, and leave it out)
                    self.failures.append(f"replica in slot {replica.slot} exited with {replica.process.returncode}")
                    return
            await asyncio.sleep(0.1)
        if replica.removed is None:
            replica.ready_at = self.clock.now
            self.balancer.serve(replica.slot)

    def _remove(self) -> None:
        """The newest replica goes first (starting ones before ready ones), as a ReplicaSet picks."""
        victim = max(self.counted, key=lambda r: r.asked)
        victim.removed = self.clock.now
        self.balancer.withdraw(victim.slot)
        victim.process.send_signal(signal.SIGTERM)  # (it answers what it holds, then exits)

    def _count(self) -> int:
        return len(self.counted)

    # ---- the scaler ------------------------------------------------------------------------------

    async def _scrape(self, replica: _LiveReplica) -> tuple[float, float, float]:
        """(requests answered or refused since the last scrape, waiting now, predicted wait now)."""
        assert self._session is not None
        async with self._session.get(f"http://127.0.0.1:{replica.port}/metrics") as resp:
            text = await resp.text()
        total = waiting = predicted = 0.0
        for line in text.splitlines():
            if line.startswith("inferd_requests_total{"):
                total += float(line.rsplit(" ", 1)[1])
            elif line.startswith("inferd_requests_waiting "):
                waiting = float(line.rsplit(" ", 1)[1])
            elif line.startswith("inferd_predicted_wait_max_seconds "):
                predicted = float(line.rsplit(" ", 1)[1])
        arrived, replica.counted_total = total - replica.counted_total, total
        return arrived, waiting, predicted

    async def _sampling(self) -> None:
        interval = self.settings.sample_s
        while True:
            await asyncio.sleep(interval)
            ready = self.ready
            scraped = await asyncio.gather(*(self._scrape(r) for r in ready), return_exceptions=True)
            readings = [s for s in scraped if not isinstance(s, BaseException)]
            arrived = sum(a for a, _, _ in readings)
            self.arrived_total += arrived
            self.samples.append(Sample(self.clock.now, len(ready), 0.0, int(sum(w for _, w, _ in readings)),
                                       max((p for _, _, p in readings), default=0.0), arrived / interval,
                                       self.arrived_total))

    async def _scaling(self) -> None:
        while True:
            await asyncio.sleep(self.hpa_settings.poll_s)
            metrics = self.policy.signals(cast(Any, self))
            self._scale_to(self.hpa.desired(self.clock.now, len(self.counted), metrics))

    # ---- the run ---------------------------------------------------------------------------------

    async def run(self, arrivals: Iterable[Arrival], until_s: float, slo_s: float) -> FleetResult:
        """Send each arrival at its time (open loop) through HAProxy; scale meanwhile."""
        assert self._session is not None
        session, url = self._session, f"http://127.0.0.1:{self.balancer.port}/v1/inference"
        for _ in range(self.settings.initial_replicas):
            self._add(0.0)
        while len(self.ready) < self.settings.initial_replicas:
            await asyncio.sleep(0.05)
        self.clock = _WallClock()  # (the day starts once the first replicas serve)
        for replica in self.ready:
            replica.asked = replica.ready_at = 0.0
        self._replicas_over_time.append((0.0, len(self.counted)))
        outcomes: list[Outcome] = []
        sending: list[asyncio.Task] = []

        async def one(number: int, outcome: Outcome) -> None:
            try:
                async with session.post(url, json={"input": f"q{number}"}) as resp:
                    await resp.read()
                    if resp.status == 200:
                        outcome.done = self.clock.now
                    elif resp.status in (429, 503):
                        outcome.refused = True
                    else:
                        self.failures.append(f"q{number}: {resp.status}")
            except aiohttp.ClientError as exc:
                self.failures.append(f"q{number}: {exc!r}")

        loops = [asyncio.create_task(self._sampling()), asyncio.create_task(self._scaling())]
        try:
            for number, arrival in enumerate(arrivals):
                delay = arrival.at - self.clock.now
                if delay > 0:
                    await asyncio.sleep(delay)
                outcome = Outcome(self.clock.now, slo_s, arrival.tier)
                outcomes.append(outcome)
                sending.append(asyncio.create_task(one(number, outcome)))
            await asyncio.gather(*sending)
            await asyncio.sleep(max(0.0, until_s - self.clock.now))
        finally:
            for task in loops:
                task.cancel()
        replica_s = sum(min(until_s, r.removed if r.removed is not None else until_s) - r.asked
                        for r in self._replicas if r.asked < until_s)
        return FleetResult(outcomes, replica_s, self.samples, self._replicas_over_time, self._scale_events)
