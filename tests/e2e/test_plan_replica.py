"""`inferd plan` against a live server (issue 53): its simulated replica, fed the same arrivals, makes
the same batches, of the same sizes in the same order, and refuses the same requests; and a plan made
from what a live server recorded (its access log, its /v1/models answer) replays that day.

The live server serves the simulated GPU (100 ms a call, batches of up to 8, 315 ms deadlines); the
client sends clumps of requests, each while the worker is busy with the batch before it, so that what a
batch takes is decided by arrivals tens of milliseconds from its start, and each request's admission by
a margin of tens of milliseconds, not by a loaded host's scheduling (a worker's turnaround, the loop's
delay in handing a batch over: up to ~7 ms on two busy cores, which the simulation does not model). The
simulation is fed what the server saw: each request's arrival as its admission stamped it (recorded on
the way into the queue), and each device call's measured time (a loaded host's sleep overshoots by up to
~20 ms). Nothing else is shared: the replica is `inferd.planning.replica.Replica`, its own batcher, cost
model and admission on a virtual clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import random
import time

import aiohttp

from inferd.cli import main
from inferd.planning.fleet import Fleet, FleetSettings
from inferd.planning.replica import SimDevice
from inferd.planning.traces import Arrival
from tests.helpers import running_server, sim_model

# (seconds after the first, how many, seconds between them): one request alone on an idle worker, then
# a clump during its batch (a full batch and a partial one after it); again, with a clump too large for
# its deadlines: of the 40, the two batches after the running one finish by 300 ms, the third's would
# end ~80 ms past 315, so admission refuses those 24; at the end a few on an idle worker.
CLUMPS = [(0.000, 1, 0.0), (0.020, 12, 0.0015), (0.600, 1, 0.0), (0.620, 40, 0.0005), (1.300, 3, 0.004)]


class ReplayedDevice:
    """The simulated replica's device: each call takes what the live server's call of that turn took
    (the replica's warm-up calls, and any beyond the live ones, the nominal 100 ms)."""

    def __init__(self, took: list[float], warmup_calls: int) -> None:
        self.took, self.warmup_calls, self.sizes, self.calls = took, warmup_calls, [], 0

    def __call__(self, size: int, bucket: int) -> float:
        self.calls += 1
        turn = self.calls - self.warmup_calls - 1
        if turn < 0:
            return SimDevice(100.0)(size, bucket)
        self.sizes.append(size)
        return self.took[turn] if turn < len(self.took) else SimDevice(100.0)(size, bucket)


async def test_the_simulated_replica_batches_and_refuses_as_the_live_server_does():
    model = sim_model(latency_ms=100, max_batch_size=8, max_wait_ms=30, timeout_ms=315)
    async with running_server(model) as srv, aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        served = srv.models.served["m"].versions["1"].model
        gpu = served.workers[0].backend
        warmed = len(gpu.calls)
        arrived: list[tuple[float, str]] = []  # (the admission's stamp, request id), in the order admitted
        enqueue = served.intake.enqueue

        def recorded(request, now):  # type: ignore[no-untyped-def]
            arrived.append((now, request.request_id))
            return enqueue(request, now)

        served.intake.enqueue = recorded
        statuses: dict[str, int] = {}

        async def one(i: int) -> None:
            async with http.post(f"{srv.url}/v1/inference", json={"input": f"r{i}"}, headers={"X-Request-ID": f"q{i}"}) as resp:
                await resp.read()
                statuses[f"q{i}"] = resp.status

        sending, began, number = [], time.monotonic(), 0
        for at, count, spacing in CLUMPS:
            for k in range(count):
                await asyncio.sleep(max(0.0, began + at + k * spacing - time.monotonic()))
                sending.append(asyncio.ensure_future(one(number)))
                number += 1
        await asyncio.gather(*sending)
        live = gpu.calls[warmed:]
    assert len(statuses) == len(arrived) == sum(count for _, count, _ in CLUMPS)
    live_refused = {rid for rid, status in statuses.items() if status != 200}
    assert {statuses[rid] for rid in live_refused} == {503}
    assert 0 < len(live_refused) < 40 and live_refused <= {f"q{i}" for i in range(14, 54)}  # (some of the big clump)

    first = arrived[0][0]
    device = ReplayedDevice([end - start for start, end, _ in live], warmup_calls=2)  # (the replica warms 1 and 8)
    fleet = Fleet(model, device, None, None, FleetSettings(start_s=0.0), buckets=1)
    result = fleet.run([Arrival(at - first + 1.0, 0) for at, _ in arrived], 5.0, slo_s=10.0)
    simulated_refused = {rid for (_, rid), outcome in zip(arrived, result.outcomes, strict=True) if outcome.refused}
    assert all(o.done is not None for o in result.outcomes if not o.refused)  # (none expired in the queue)

    assert device.sizes == [size for _, _, size in live], (device.sizes, live)
    assert simulated_refused == live_refused


async def test_inferd_plan_replays_what_a_live_server_recorded(tmp_path, caplog):
    """A server on the simulated GPU (50 ms a batch of up to 8) answers ~100 requests/s for three seconds
    with every access-log line kept; its access log and its /v1/models answer are all `inferd plan` needs."""
    with caplog.at_level(logging.INFO, logger="inferd.access"):
        async with running_server(sim_model(latency_ms=50, max_batch_size=8, slo_ms=500), access_log_sample_rate=1.0) as srv, \
                aiohttp.ClientSession() as http:

            async def one(i: int) -> None:
                async with http.post(f"{srv.url}/v1/inference", json={"input": f"q{i}"}) as resp:
                    assert resp.status == 200

            draws, sending = random.Random(3), []
            for i in range(300):
                sending.append(asyncio.ensure_future(one(i)))
                await asyncio.sleep(draws.expovariate(100.0))
            await asyncio.gather(*sending)
            async with http.get(f"{srv.url}/v1/models/m") as resp:
                described = await resp.json()
    log = tmp_path / "access.log"
    log.write_text("\n".join(r.getMessage() for r in caplog.records if r.name == "inferd.access") + "\n")
    served = tmp_path / "m.json"
    served.write_text(json.dumps(described))
    out = tmp_path / "plan.json"
    assert main(["plan", "--access-log", str(log), "--served-model", str(served), "--policies", "shipped", "--start-s", "5",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["trace"]["recorded_requests"] == 300 and 2.0 < result["trace"]["day_s"] <= 6.0
    assert result["settings"]["max_batch_size"] == 8 and result["settings"]["slo_ms"] == 500
    assert 100 < result["capacity_rps"] < 8 / 0.050 * 1.1  # (a full batch of 8 each ~50 ms, at most)
    for row in result["policies"].values():  # one replica keeps up with ~100 req/s: every request in time
        assert row["requests"] == 300 and row["within_slo"] == 1.0
