"""The load generator's engines: Python (open or closed loop, in one or more processes) and wrk.

Open loop: send times are drawn in advance as a Poisson process (exponential gaps) and every latency is
counted from the request's *scheduled* send time, so a server that stalls cannot hide its queue behind
a generator that politely waited (no coordinated omission). Closed loop: N clients, each sending its
next request when the last one returns; latency counts from the actual send.

Warm-up runs on the same connections as the measured step (the Python engine): a step never opens its
connections all at once at its start, and the time to open one (and failures to) is reported apart from
request latency (`connect_ms`, `connect_error`), not folded into it.

Every run is bounded: no request is scheduled past `warmup_s + duration_s`, and none waits more than
`timeout_s`.

The Python engine measures itself too: its event loop's lag (a 5 ms timer's lateness) through the
measured part. A generator whose loop runs late sends late and reads answers late, and so measures
itself; the result says so (`generator`), and `inferd bench` warns.
"""

from __future__ import annotations

import asyncio
import multiprocessing
import random
import sys
import time
import urllib.request
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import aiohttp
import orjson

LAG_PROBE_S = 0.005
WORDS_MAX = 48  # {words}: inputs of 1 to this many words, spread over the lengths by the counter


def words(i: int) -> str:
    """Request `i`'s run of words: 1 to WORDS_MAX of them (a real mix of input lengths, so batches meet
    many shapes), the same for a counter whichever engine sends it."""
    return "word " * ((i * 7919) % WORDS_MAX) + "end"


def fill_body(template: bytes, i: int) -> bytes:
    """A request's body: `{i}` is its counter, `{words}` its run of words."""
    body = template.replace(b"{i}", str(i).encode())
    return body.replace(b"{words}", words(i).encode()) if b"{words}" in body else body


@dataclass(frozen=True)
class LoadSpec:
    """One load step: what to send where, open loop (`rate`) or closed loop (`concurrency`), for how long."""

    url: str
    body: bytes | None = None  # may hold {i} (a per-request counter) and {words} (1 to 48 words, by the counter)
    method: str = "POST"
    headers: tuple[tuple[str, str], ...] = (("Content-Type", "application/json"),)
    rate: float | None = None  # open loop: requests per second
    concurrency: int | None = None  # closed loop: clients
    duration_s: float = 10.0
    timeout_s: float = 30.0
    processes: int = 1
    max_connections: int = 2000  # open loop: at most this many requests in flight at once
    seed: int = 1
    counter_start: int = 0
    warmup_s: float = 0.0  # load on the same connections before the measured `duration_s` (Python engine)
    stats_url: str | None = None  # read when the measured part starts (the server's view of the step)

    @property
    def mode(self) -> str:
        return "open" if self.rate is not None else "closed"


@dataclass
class Samples:
    """What one engine run saw: exact latencies (ms) of completed requests, and every outcome."""

    latencies_ms: list[float] = field(default_factory=list)  # request latency, the time to connect excluded
    connect_ms: list[float] = field(default_factory=list)  # each new connection's time to open
    sent: int = 0
    # "200", "503", "timeout", "connect_error" (could not open a connection), "connection_error" (lost one)
    statuses: Counter[str] = field(default_factory=Counter)
    error_codes: Counter[str] = field(default_factory=Counter)  # the JSON `error` of non-200 answers
    wall_s: float = 0.0
    in_window: int = 0  # answers (any status) that arrived within the step's duration
    engine: str = "python"
    percentiles_ms: dict[str, float] | None = None  # set by engines that do not return every sample
    stats_before: dict[str, Any] | None = None  # the server's /v1/stats as the measured part began
    loop_lag_ms: list[float] = field(default_factory=list)  # the generator's own loop, late by this (Python engine)

    def merge(self, other: Samples) -> None:
        self.latencies_ms.extend(other.latencies_ms)
        self.loop_lag_ms.extend(other.loop_lag_ms)
        self.connect_ms.extend(other.connect_ms)
        self.stats_before = self.stats_before or other.stats_before
        self.sent += other.sent
        self.statuses.update(other.statuses)
        self.error_codes.update(other.error_codes)
        self.wall_s = max(self.wall_s, other.wall_s)
        self.in_window += other.in_window


def run_python(spec: LoadSpec) -> Samples:
    """The Python engine: open or closed loop, in `spec.processes` processes."""
    if spec.processes <= 1:
        return asyncio.run(_python_engine(spec, 0, 1))
    ctx = multiprocessing.get_context("spawn")
    with ctx.Pool(spec.processes) as pool:
        parts = pool.starmap(_python_engine_process, [(spec, i, spec.processes) for i in range(spec.processes)])
    merged = Samples()
    for part in parts:
        merged.merge(part)
    return merged


async def open_loop(rate: float, duration_s: float, rng: random.Random,
                    send: Callable[[int, float], Coroutine[Any, Any, None]], began: float | None = None) -> int:
    """Start `send(i, scheduled)` at Poisson arrival times (`rate` per second) for `duration_s`, never
    waiting for an answer before the next send, so a slow server cannot slow the arrivals. `scheduled` is
    the loop time the send was due. Returns how many were sent, once every one of them has finished."""
    loop = asyncio.get_running_loop()
    began = loop.time() if began is None else began
    tasks: set[asyncio.Task] = set()
    scheduled, sent = began, 0
    while True:
        scheduled += rng.expovariate(rate)
        if scheduled - began >= duration_s:
            break
        delay = scheduled - loop.time()
        if delay > 0.0005:
            await asyncio.sleep(delay)
        task = loop.create_task(send(sent, scheduled))
        tasks.add(task)
        task.add_done_callback(tasks.discard)
        sent += 1
    if tasks:
        await asyncio.wait(tasks)
    return sent


def _python_engine_process(spec: LoadSpec, index: int, count: int) -> Samples:
    return asyncio.run(_python_engine(spec, index, count))


async def _python_engine(spec: LoadSpec, index: int, count: int) -> Samples:
    """One process's share of the load: warm-up, then the measured part, on one connection pool. Only
    requests started in the measured part are counted."""
    samples = Samples()
    loop = asyncio.get_running_loop()
    limit = max(1, spec.max_connections // count) if spec.mode == "open" else 0
    connector = aiohttp.TCPConnector(limit=limit, force_close=False)
    timeout = aiohttp.ClientTimeout(total=spec.timeout_s)
    headers = dict(spec.headers)
    template = spec.body
    counter = iter(range(spec.counter_start + index, 1 << 62, count))
    tracing = aiohttp.TraceConfig()
    tracing.on_connection_create_start.append(_connect_started)
    tracing.on_connection_create_end.append(_connect_ended)

    async def one(session: aiohttp.ClientSession, started: float) -> None:
        i = next(counter)
        body = fill_body(template, i) if template is not None else None
        counted = started >= measured_from
        if counted:
            samples.sent += 1
        trace = SimpleNamespace(connect_s=0.0)
        try:
            async with session.request(spec.method, spec.url, data=body, headers=headers, trace_request_ctx=trace) as resp:
                payload = await resp.read()
                status = resp.status
        except TimeoutError:
            if counted:
                samples.statuses["timeout"] += 1
            return
        except aiohttp.ClientConnectorError:
            if counted:
                samples.statuses["connect_error"] += 1
            return
        except (aiohttp.ClientError, OSError):
            if counted:
                samples.statuses["connection_error"] += 1
            return
        if not counted:
            return
        now = loop.time()
        if trace.connect_s:
            samples.connect_ms.append(trace.connect_s * 1000.0)
        samples.latencies_ms.append((now - started - trace.connect_s) * 1000.0)
        samples.statuses[str(status)] += 1
        if now <= end:
            samples.in_window += 1
        if status != 200:
            samples.error_codes[_error_code(payload)] += 1

    async def read_stats_at_start() -> None:
        await asyncio.sleep(max(0.0, measured_from - loop.time()))
        if spec.stats_url and index == 0:
            samples.stats_before = await loop.run_in_executor(None, fetch_stats, spec.stats_url)

    async def watch_own_lag() -> None:
        while (now := loop.time()) < end:
            await asyncio.sleep(LAG_PROBE_S)
            if now >= measured_from:
                samples.loop_lag_ms.append(max(0.0, loop.time() - now - LAG_PROBE_S) * 1000.0)

    began = loop.time()
    measured_from = began + spec.warmup_s
    end = measured_from + spec.duration_s
    stats_task = loop.create_task(read_stats_at_start())
    lag_task = loop.create_task(watch_own_lag())
    async with aiohttp.ClientSession(connector=connector, timeout=timeout, trace_configs=[tracing]) as session:
        if spec.mode == "open":
            rng = random.Random(spec.seed * 1000 + index)
            assert spec.rate is not None  # (`mode` is open where the rate is given)
            rate = spec.rate / count
            # latency counts from `scheduled`
            await open_loop(rate, spec.warmup_s + spec.duration_s, rng, lambda _, scheduled: one(session, scheduled),
                            began=began)
        else:
            assert spec.concurrency is not None, "a closed loop's step names its clients (`concurrency`)"
            clients = spec.concurrency // count + (1 if index < spec.concurrency % count else 0)

            async def client(k: int) -> None:
                # Clients join over the warm-up (or at once without one): no storm of connections.
                await asyncio.sleep(spec.warmup_s / 2 * k / max(1, clients))
                while loop.time() < end:
                    await one(session, loop.time())

            await asyncio.gather(*(client(k) for k in range(clients)))
        samples.wall_s = loop.time() - measured_from
    await stats_task
    lag_task.cancel()
    return samples


async def _connect_started(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    ctx.connect_started = asyncio.get_running_loop().time()


async def _connect_ended(session: Any, ctx: SimpleNamespace, params: Any) -> None:
    request = ctx.trace_request_ctx
    if request is not None:
        request.connect_s += asyncio.get_running_loop().time() - ctx.connect_started


def fetch_stats(stats_url: str | None) -> dict[str, Any] | None:
    """The target's GET /v1/stats (inferd's server view), or None when it cannot be read."""
    if not stats_url:
        return None
    error: Exception | None = None
    for _ in range(3):
        try:
            with urllib.request.urlopen(stats_url, timeout=10) as resp:
                return orjson.loads(resp.read())
        except (OSError, ValueError) as exc:
            error = exc
            time.sleep(0.5)
    print(f"\nno server view from {stats_url}: {error}", file=sys.stderr)
    return None


def _error_code(payload: bytes) -> str:
    try:
        data = orjson.loads(payload)
        return str(data.get("error", "unknown")) if isinstance(data, dict) else "non_json"
    except orjson.JSONDecodeError:
        return "non_json"
