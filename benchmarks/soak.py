"""Soaks: minutes of load against one server, every answer checked against its own input. Not part of
the test suite (each runs for minutes).

    .venv/bin/python benchmarks/soak.py faults --duration 300 --rate 700
    .venv/bin/python benchmarks/soak.py memory --duration 600
    .venv/bin/python benchmarks/soak.py mixed --duration 600
    .venv/bin/python benchmarks/soak.py floods

`faults`: S1 load with random hangs and poison inputs, counting that every request is answered exactly
once. Open-loop Poisson load at --rate for --duration seconds against inferd serving the faulty
simulated GPU (100 ms per batch, batches up to 100): a share of batches hang for `hang_s` (the watchdog
replaces the worker), and a share of inputs carry a poison
marker (isolated by bisection, answered 500). Each request has a unique X-Request-ID; every answer is
checked against its own input. Results go to benchmarks/results/soak_faults.json.

`memory`: does RSS stay flat once every cap is full, and do the caps hold what they count? Open-loop
Poisson load at about 70% of capacity (the seed's function at 50 ms a batch of up to 32: ~640 req/s)
against inferd with the result cache on (`cache_bytes`) and the Idempotency-Key table bounded
(`idempotency_max_bytes`); every input distinct;
a tenth of the inputs ~90 KB; a fifth of the requests carry an Idempotency-Key (and a tenth of those
repeat an earlier key with its body, which must be answered with the first answer, replayed); a
rollout every 30 s through the admin API (load the next version, move all traffic to it, unload the
last). Every answer is checked against its own input. RSS (the server's /v1/stats) is sampled every
5 s; once the caps are full each minute's median must stay within 5% of their median, and the RSS the
caps add (against the same load with the cache off and a 1 MiB table, --baseline-duration) must be
within 1.2x of the bytes they count.

`mixed`: the traffic that once stopped a model for good (issue 79's case 0), on a simulated model and
on the real MiniLM side by side: per model, closed-loop clients of single requests (anonymous: the free
tier; every 5th text one of 50, so twins collapse and repeats hit the cache; some give up early and go
away) beside a paid tenant's clients of 1-3-input calls and, now and then, a 20-60-input one (v2 tensors
for the simulated model, /v1/embeddings for MiniLM). Every answer is checked: the simulated model's
against its function, each MiniLM vector against the model called alone on that text (in this process,
after the run). It passes with nothing lost or wrong, no worker death, every queue empty at the end,
and RSS within +50 MB of its level after the first minute. Results go to benchmarks/results/soak_mixed.json.
With `--every-kind`, a model of every kind beside them (`EveryKind`): results/soak_every_kind.json.
`floods`: the floods of issue 79, one after another against one server, and its memory after each:
5,000 gRPC calls naming made-up models, 2,000 with a key no tenant has, 5,000 HTTP calls naming made-up
models, pipelining clients that send ~100 KB requests and never read an answer, and a free-tier caller's
eight concurrent 0.9 MB `/tokenize` calls for 10 s. The server's RSS (from /proc) and the size of its
/metrics are read before each flood, at its peak and 10 s after it ends: each passes with RSS within
+50 MB of its level before, and /metrics no more than 10% larger. Results: benchmarks/results/soak_floods.json.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import random
import statistics
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parent / "scenarios"))
from common import RESULTS, inferd_server  # noqa: E402

from inferd.backends.sim import expected_output  # noqa: E402
from inferd.bench.loadgen import open_loop  # noqa: E402

FAULTS_CONFIG = """
[server]
access_log = "off"

[[models]]
name = "batchstring"
backend = "inferd.backends.faulty:create"
max_batch_size = 100
max_wait_ms = 20
workers = 2
max_queue = 4000
timeout_ms = 20000
batch_timeout_ms = 400
max_batch_attempts = 3
[models.options]
latency_ms = 100
max_batch_size = 100
fail_marker = "POISON"
hang_probability = {hang_probability}
hang_s = 3
seed = 11
"""


async def faults_soak(url: str, rate: float, duration_s: float, poison_share: float) -> dict:
    tally: Counter[str] = Counter()
    wrong: list[str] = []
    rng = random.Random(5)
    async def one(session: aiohttp.ClientSession, i: int) -> None:
        poison = rng.random() < poison_share
        text = f"{'POISON ' if poison else ''}soak {i}"
        rid = f"soak-{i}"
        try:
            async with session.post(f"{url}/v1/inference", json={"input": text}, headers={"X-Request-ID": rid}) as resp:
                body = await resp.json(content_type=None)
                status = resp.status
        except (TimeoutError, aiohttp.ClientError) as exc:
            tally[f"no_answer:{type(exc).__name__}"] += 1
            return
        tally[str(status)] += 1
        if body.get("request_id") != rid:
            wrong.append(f"{rid}: answered as {body.get('request_id')}")
        elif status == 200 and (poison or body["output"] != expected_output(text)):
            wrong.append(f"{rid}: wrong output")
        elif status == 500 and not poison:
            tally["500_not_poison"] += 1
        elif poison and status == 200:
            wrong.append(f"{rid}: poison answered 200")

    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=3000)) as session:
        i = await open_loop(rate, duration_s, rng, lambda i, _: one(session, i))
    answered = sum(v for k, v in tally.items() if k.isdigit())
    return {"sent": i, "answered": answered, "unanswered": i - answered, "wrong": len(wrong),
            "wrong_examples": wrong[:10], "statuses": dict(tally)}


def server_counts(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    answered = sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
                   if line.startswith("inferd_requests_total{") and 'model="batchstring"' in line)
    replaced = json.load(urllib.request.urlopen(f"{url}/v1/models", timeout=10))["data"][0]["workers_replaced"]
    return {"server_answered": int(answered), "workers_replaced": replaced}


def faults_main(argv: list[str]) -> None:
    """S1 load with random hangs and poison inputs: every request answered exactly once."""
    parser = argparse.ArgumentParser(prog="soak.py faults", description=faults_main.__doc__)
    parser.add_argument("--duration", type=float, default=300)
    parser.add_argument("--rate", type=float, default=700)
    parser.add_argument("--hang-probability", type=float, default=0.005, help="per batch")
    parser.add_argument("--poison-share", type=float, default=0.002, help="per input")
    parser.add_argument("--out", default=str(RESULTS / "soak_faults.json"))
    args = parser.parse_args(argv)
    started = time.monotonic()
    with inferd_server(FAULTS_CONFIG.format(hang_probability=args.hang_probability)) as url:
        result = asyncio.run(faults_soak(url, args.rate, args.duration, args.poison_share))
        result.update(server_counts(url))
    result.update(duration_s=args.duration, rate=args.rate, hang_probability=args.hang_probability,
                  poison_share=args.poison_share, wall_s=round(time.monotonic() - started, 1))
    result["exactly_once"] = result["unanswered"] == 0 and result["wrong"] == 0 and result["server_answered"] == result["sent"]
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    sys.exit(0 if result["exactly_once"] else 1)



ADMIN_KEY = "soak-admin-key"
CACHE_BYTES = 48 << 20
IDEMPOTENCY_BYTES = 24 << 20
MEMORY_CONFIG = """
[server]
access_log = "off"
idempotency_max_bytes = {idempotency_bytes}
idempotency_window_s = 600

[auth]
anonymous_tier = "default"
admin_key_sha256 = "{admin_sha256}"

[[models]]
name = "batchstring"
backend = "inferd.backends.sim:create"
max_batch_size = 32
max_wait_ms = 10
max_queue = 4000
timeout_ms = 10000
cache_bytes = {cache_bytes}
[models.options]
latency_ms = 50
max_batch_size = 32
"""
ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}


class Soak:
    def __init__(self, url: str, rate: float, duration_s: float) -> None:
        self.url, self.rate, self.duration_s = url, rate, duration_s
        self.tally: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.keyed: list[tuple[str, str, dict]] = []  # (key, text, first answer) for repeats
        self.rng = random.Random(7)
        self.samples: list[dict] = []
        self.rollouts: list[dict] = []

    def text(self, i: int) -> str:
        big = self.rng.random() < 0.1
        return f"soak {i} " + ("x" * 90_000 if big else "y" * self.rng.randint(10, 200))  # (under max_input_chars)

    async def one(self, session: aiohttp.ClientSession, i: int) -> None:
        headers = {"X-Request-ID": f"soak-{i}"}
        repeat = None
        draw = self.rng.random()
        if draw < 0.02 and self.keyed:  # a repeat of an earlier keyed request (a tenth of the keyed ones)
            repeat = self.rng.randrange(len(self.keyed))
            key, text, first = self.keyed[repeat]
            headers["Idempotency-Key"] = key
        else:
            text = self.text(i)
            if draw < 0.2:
                key = f"key-{i}"
                headers["Idempotency-Key"] = key
        try:
            async with session.post(f"{self.url}/v1/inference", json={"input": text}, headers=headers) as resp:
                body = await resp.json(content_type=None)
                status, replayed = resp.status, resp.headers.get("Idempotent-Replayed") == "true"
        except (TimeoutError, aiohttp.ClientError) as exc:
            self.tally[f"no_answer:{type(exc).__name__}"] += 1
            return
        self.tally[str(status)] += 1
        if status != 200:
            return
        if repeat is not None:
            if replayed and body != first:
                self.wrong.append(f"{key}: replay differs from the answer kept for it")
            if not replayed:  # evicted for room: computed again, and that answer is the one kept now
                self.tally["repeat_recomputed"] += 1
                self.keyed[repeat] = (key, text, body)
            else:
                self.tally["replayed"] += 1
            if body.get("output") != expected_output(text):
                self.wrong.append(f"{key}: repeat answered with another output")
            return
        if body.get("output") != expected_output(text) or body.get("request_id") != headers["X-Request-ID"]:
            self.wrong.append(f"soak-{i}: wrong answer")
        elif "Idempotency-Key" in headers and len(text) < 1000 and len(self.keyed) < 20_000:
            self.keyed.append((headers["Idempotency-Key"], text, body))  # (small ones: the client's memory)

    async def sample(self, session: aiohttp.ClientSession, started: float) -> None:
        while time.monotonic() - started < self.duration_s:
            async with session.get(f"{self.url}/v1/stats") as resp:
                stats = await resp.json()
            async with session.get(f"{self.url}/v1/models/batchstring") as resp:
                model = await resp.json()
            cache = model.get("cache") or {}
            self.samples.append({"t": round(time.monotonic() - started, 1), "rss": stats["process"]["rss_bytes"],
                                 "cache_bytes": cache.get("bytes", 0), "cache_entries": cache.get("entries", 0),
                                 "idempotency_bytes": stats["idempotency"]["bytes"],
                                 "idempotency_keys": stats["idempotency"]["keys"]})
            await asyncio.sleep(5)

    async def roll(self, session: aiohttp.ClientSession, started: float) -> None:
        version = 1
        while time.monotonic() - started < self.duration_s - 35:
            await asyncio.sleep(30)
            new, t0 = str(version + 1), time.monotonic()
            async with session.post(f"{self.url}/v1/admin/models", json={"name": "batchstring", "version": new},
                                    headers=ADMIN) as resp:
                assert resp.status == 202, await resp.text()
            while True:
                async with session.get(f"{self.url}/v1/admin/models", headers=ADMIN) as resp:
                    state = (await resp.json())["models"]["batchstring"]["versions"][new]["state"]
                if state == "ready":
                    break
                assert state == "loading", state
                await asyncio.sleep(0.2)
            async with session.put(f"{self.url}/v1/admin/models/batchstring/traffic", json={new: 1}, headers=ADMIN) as resp:
                assert resp.status == 200, await resp.text()
            async with session.delete(f"{self.url}/v1/admin/models/batchstring/versions/{version}", headers=ADMIN) as resp:
                assert resp.status == 202, await resp.text()
            self.rollouts.append({"to": new, "took_s": round(time.monotonic() - t0, 2)})
            version += 1

    async def run(self) -> int:
        started = time.monotonic()
        timeout = aiohttp.ClientTimeout(total=60)
        async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=3000)) as session:
            watchers = [asyncio.ensure_future(self.sample(session, started)), asyncio.ensure_future(self.roll(session, started))]
            sent = await open_loop(self.rate, self.duration_s, self.rng, lambda i, _: self.one(session, i))
            await asyncio.gather(*watchers)
        return sent


def since(samples: list[dict], t: float) -> list[dict]:
    """The samples from `t` on (the last one when none is that late: a short run)."""
    return [s for s in samples if s["t"] >= t] or samples[-1:]


def minute_levels(samples: list[dict], since_s: float) -> list[float]:
    """RSS by minute once the caps are full: each minute's median (a rollout's moment with two versions'
    caches, or with the old one gone and the new one still filling, is one sample, not a level)."""
    minutes: dict[int, list[int]] = {}
    for sample in samples:
        if sample["t"] >= since_s:
            minutes.setdefault(int((sample["t"] - since_s) // 60), []).append(sample["rss"])
    return [statistics.median(v) for k, v in sorted(minutes.items()) if len(v) >= 6]


def phase(cache_bytes: int, idempotency_bytes: int, rate: float, duration_s: float) -> tuple[Soak, int]:
    config = MEMORY_CONFIG.format(cache_bytes=cache_bytes, idempotency_bytes=idempotency_bytes,
                           admin_sha256=hashlib.sha256(ADMIN_KEY.encode()).hexdigest())
    if not cache_bytes:
        config = config.replace("cache_bytes = 0\n", "")
    with inferd_server(config) as url:
        soak = Soak(url, rate, duration_s)
        sent = asyncio.run(soak.run())
    return soak, sent


def memory_main(argv: list[str]) -> None:
    """About 70% load with every cap full and rollouts: RSS flat, the caps holding what they count."""
    parser = argparse.ArgumentParser(prog="soak.py memory", description=memory_main.__doc__)
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--baseline-duration", type=float, default=180, help="the same load with the caps off")
    parser.add_argument("--rate", type=float, default=450, help="requests/s (70%% of ~640)")
    parser.add_argument("--settle", type=float, default=60, help="at least this long before RSS is held flat "
                                                                   "(and until the caps are full)")
    parser.add_argument("--out", default=str(RESULTS / "soak_memory.json"))
    args = parser.parse_args(argv)
    soak, sent = phase(CACHE_BYTES, IDEMPOTENCY_BYTES, args.rate, args.duration)
    bare, bare_sent = phase(0, 1 << 20, args.rate, args.baseline_duration)  # (no cache, a 1 MiB table)
    answered = sum(v for k, v in soak.tally.items() if k.isdigit())
    bare_answered = sum(v for k, v in bare.tally.items() if k.isdigit())
    full = [s["t"] for s in soak.samples if s["idempotency_bytes"] >= 0.95 * IDEMPOTENCY_BYTES]
    settle_at = max(args.settle, full[0]) if full else args.duration  # (the table is the slower cap to fill)
    levels = minute_levels(soak.samples, settle_at)
    level = statistics.median(levels) if levels else None
    bare_level = statistics.median(s["rss"] for s in since(bare.samples, args.settle)) if bare.samples else None
    counted = statistics.median(s["cache_bytes"] + s["idempotency_bytes"] for s in since(soak.samples, settle_at))
    bare_counted = statistics.median(s["cache_bytes"] + s["idempotency_bytes"] for s in since(bare.samples, args.settle))
    spread = max(abs(v - level) / level for v in levels) if levels and level else None
    held = (level - bare_level) / (counted - bare_counted) if level and bare_level and counted > bare_counted else None
    result = {
        "command": f".venv/bin/python benchmarks/soak.py memory --duration {args.duration:g} --rate {args.rate:g}",
        "sent": sent, "answered": answered, "lost": sent - answered + bare_sent - bare_answered,
        "wrong": len(soak.wrong) + len(bare.wrong), "wrong_examples": (soak.wrong + bare.wrong)[:10],
        "statuses": dict(soak.tally), "rollouts": len(soak.rollouts),
        "rollout_s": sorted(r["took_s"] for r in soak.rollouts)[len(soak.rollouts) // 2] if soak.rollouts else None,
        "caps_full_at_s": settle_at, "cache_bytes_cap": CACHE_BYTES, "idempotency_bytes_cap": IDEMPOTENCY_BYTES,
        "rss_by_minute_mib": [round(v / 2**20, 1) for v in levels],
        "rss_minute_spread": round(spread, 4) if spread is not None else None,
        "rss_caps_off_mib": round(bare_level / 2**20, 1) if bare_level else None,
        "caps_counted_mib": round(counted / 2**20, 1),
        "rss_held_by_caps_over_counted": round(held, 3) if held is not None else None,
        "samples": soak.samples, "samples_caps_off": bare.samples,
    }
    result["flat"] = spread is not None and spread <= 0.05
    result["caps_hold"] = held is not None and held <= 1.2
    result["ok"] = result["lost"] == 0 and result["wrong"] == 0 and result["flat"] and result["caps_hold"]
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if not k.startswith("samples")}, indent=2))
    sys.exit(0 if result["ok"] else 1)


PAID_KEY = "soak-paid-key"
MIXED_CONFIG = """
[server]
access_log = "off"
keep_freed_memory_mb = {keep_freed_mb}

[auth]
anonymous_tier = "free"

[tiers.paid]
[tiers.free]

[[tenants]]
name = "acme"
tier = "paid"
key_sha256 = "{paid_sha256}"

[[models]]
name = "sim"
backend = "inferd.backends.sim:create"
max_batch_size = 64
max_wait_ms = 5
timeout_ms = 5000
cache_bytes = 4194304
[models.options]
latency_ms = 30
max_batch_size = 64

[[models]]
name = "minilm"
backend = "inferd.backends.transformer:create"
max_batch_size = 32
max_wait_ms = 5
timeout_ms = 20000
cache_bytes = 4194304
[models.options]
max_tokens = 64
bucket_edges = [16, 32, 64]
"""
PAID = {"Authorization": f"Bearer {PAID_KEY}"}
WORDS = "the quick brown fox jumps over a lazy dog while batching servers gather requests".split()


class Mixed:
    """Closed-loop clients of both kinds on both models, every answer kept for its check."""

    def __init__(self, url: str, duration_s: float) -> None:
        self.url, self.duration_s = url, duration_s
        self.tally: Counter[str] = Counter()
        self.wrong: list[str] = []
        self.vectors: dict[str, list[float]] = {}  # MiniLM: a text's first vector (checked against the model after)
        self.samples: list[dict] = []
        self.refusals: dict[str, str] = {}  # an example message of each refusal
        self.rng = random.Random(79)

    def text(self, model: str, who: str, i: int) -> str:
        if i % 5 == 0:
            return f"repeated {model} {i % 50}"
        words = [WORDS[(i + j) % len(WORDS)] for j in range(1 + (i * 7) % 40)]  # 1-40 words: every bucket
        return f"{who} {i} " + " ".join(words)

    def check(self, model: str, text: str, output: object) -> None:
        if model == "sim":
            if output != expected_output(text):
                self.wrong.append(f"sim {text!r}: another output")
        elif not isinstance(output, list) or len(output) != 384:
            self.wrong.append(f"minilm {text!r}: not a 384-float vector")
        elif (first := self.vectors.setdefault(text, output)) is not output and max(
                abs(a - b) for a, b in zip(first, output, strict=True)) > 1e-4:
            self.wrong.append(f"minilm {text!r}: two answers differ")

    async def post(self, session: aiohttp.ClientSession, path: str, body: dict, headers: dict | None,
                   give_up_s: float | None) -> tuple[int, dict] | None:
        try:
            async with session.post(f"{self.url}{path}", json=body, headers=headers,
                                    timeout=aiohttp.ClientTimeout(total=give_up_s or 60)) as resp:
                return resp.status, await resp.json(content_type=None)
        except TimeoutError:
            if give_up_s is None:
                self.tally["no_answer"] += 1
            else:
                self.tally["went_away"] += 1  # (the client's own choice: the server withdraws its request)
            return None
        except aiohttp.ClientError as exc:
            self.tally[f"no_answer:{type(exc).__name__}"] += 1
            return None

    async def singles(self, session: aiohttp.ClientSession, model: str, who: str, until: float) -> None:
        i = 0
        while time.monotonic() < until:
            i += 1
            text = self.text(model, who, i)
            give_up_s = 0.01 if self.rng.random() < 0.02 else None
            answer = await self.post(session, "/v1/inference", {"model": model, "input": text, "timeout_ms": 20_000},
                                     None, give_up_s)
            if answer is not None:
                self.count(model, "single", answer, lambda body, text=text: self.check(model, text, body["output"]))
                if answer[0] in (429, 503):  # (as a client should: back off as told, at most a second)
                    await asyncio.sleep(min(1.0, answer[1].get("retry_after_ms", 100) / 1000))

    async def calls(self, session: aiohttp.ClientSession, model: str, who: str, until: float) -> None:
        i = 0
        while time.monotonic() < until:
            i += 1
            n = self.rng.randint(20, 60) if self.rng.random() < 0.1 else self.rng.randint(1, 3)
            texts = [self.text(model, f"{who}-{i}", j) for j in range(n)]
            if model == "sim":
                body = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [n], "data": texts}],
                        "parameters": {"timeout": 20_000_000}}
                answer = await self.post(session, "/v2/models/sim/infer", body, PAID, None)

                def check(body: dict, texts: list[str] = texts) -> None:
                    for text, output in zip(texts, body["outputs"][0]["data"], strict=True):
                        self.check("sim", text, output)
            else:
                answer = await self.post(session, "/v1/embeddings", {"model": "minilm", "input": texts}, PAID, None)

                def check(body: dict, texts: list[str] = texts) -> None:
                    for text, item in zip(texts, sorted(body["data"], key=lambda d: d["index"]), strict=True):
                        self.check("minilm", text, item["embedding"])
            if answer is not None:
                self.count(model, "call", answer, check)
                if answer[0] in (429, 503):
                    await asyncio.sleep(min(1.0, answer[1].get("retry_after_ms", 100) / 1000))

    def count(self, model: str, kind: str, answer: tuple[int, dict], check: object) -> None:
        status, body = answer
        self.tally[f"{model} {kind} {status}"] += 1
        if status == 200:
            try:
                check(body)  # type: ignore[operator]
            except (KeyError, ValueError, TypeError) as exc:
                self.wrong.append(f"{model} {kind}: unreadable answer {exc!r}")
        elif status == 500 or status == 504:
            self.wrong.append(f"{model} {kind}: {status} {body.get('error')} {body.get('message')}")
        else:
            error = body.get("error")
            code, message = (error.get("code"), error.get("message")) if isinstance(error, dict) else (error, body.get("message"))
            self.tally[f"{model} {kind} {status} {body.get('reason') or code}"] += 1
            self.refusals.setdefault(f"{status} {code}", message)

    async def sample(self, session: aiohttp.ClientSession, started: float, until: float) -> None:
        while time.monotonic() < until:
            async with session.get(f"{self.url}/v1/stats") as resp:
                stats = await resp.json()
            self.samples.append({"t": round(time.monotonic() - started, 1), "rss": stats["process"]["rss_bytes"]})
            await asyncio.sleep(5)

    async def run(self, singles: int, callers: int) -> dict:
        started = time.monotonic()
        until = started + self.duration_s
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as session:
            clients = [self.singles(session, m, f"s{m}{i}", until) for m in ("sim", "minilm") for i in range(singles)]
            clients += [self.calls(session, m, f"c{m}{i}", until) for m in ("sim", "minilm") for i in range(callers)]
            await asyncio.gather(self.sample(session, started, until), *clients)
            await asyncio.sleep(1.0)  # (what clients gave up on leaves the queues)
            async with session.get(f"{self.url}/v1/models") as resp:
                models = {m["id"]: m for m in (await resp.json())["data"]}
        return {name: {"worker_deaths": m["worker_deaths"], "workers_replaced": m["workers_replaced"],
                       "queue_depth": m["stats"]["queue_depth"], "batches": m["stats"]["batches"],
                       "mean_batch_size": m["stats"]["mean_batch_size"]} if m.get("kind") != "generation" else
                {"worker_deaths": 0, "queue_depth": m["stats"]["waiting"] + m["stats"]["running"],
                 "output_tokens": m["stats"]["output_tokens"]} for name, m in models.items()}


def mixed_main(argv: list[str]) -> None:
    """The traffic that once stopped a model, on a simulated model and MiniLM: nothing lost or wrong."""
    parser = argparse.ArgumentParser(prog="soak.py mixed", description=mixed_main.__doc__)
    parser.add_argument("--duration", type=float, default=600)
    parser.add_argument("--singles", type=int, default=8, help="closed-loop single-request clients per model")
    parser.add_argument("--callers", type=int, default=3, help="closed-loop multi-input call clients per model")
    parser.add_argument("--every-kind", action="store_true",
                        help="a reranker, a classifier, an image embedder and a generation engine beside them")
    parser.add_argument("--keep-freed-mb", type=int, default=512,
                        help="the server's keep_freed_memory_mb (its default 512: freed memory malloc keeps for reuse)")
    parser.add_argument("--out", default=None, help="default: results/soak_mixed.json (soak_every_kind.json)")
    args = parser.parse_args(argv)
    out = args.out or str(RESULTS / ("soak_every_kind.json" if args.every_kind else "soak_mixed.json"))
    config = MIXED_CONFIG.format(paid_sha256=hashlib.sha256(PAID_KEY.encode()).hexdigest(), keep_freed_mb=args.keep_freed_mb)
    paths: dict[str, str] = {}
    if args.every_kind:
        import tempfile

        from inferd.backends.small_models import build_classifier, build_cross_encoder, build_tiny_vit

        folder = Path(tempfile.mkdtemp(prefix="soak-models-"))
        paths = {"rr": str(build_cross_encoder(folder / "rr")), "clf": str(build_classifier(folder / "clf")),
                 "vit": str(build_tiny_vit(folder / "vit"))}
        config += EVERY_KIND_MODELS.format(**paths)
    with inferd_server(config) as url:
        soak = EveryKind(url, args.duration, paths) if args.every_kind else Mixed(url, args.duration)
        models = asyncio.run(soak.run(args.singles, args.callers))
    kinds_checked = soak.check_against_the_models() if isinstance(soak, EveryKind) else 0
    from inferd.backends.transformer import TextModel  # (the reference: the model called alone, one text at a time)

    reference = TextModel("cpu", {"max_tokens": 64, "bucket_edges": [16, 32, 64]})
    texts = sorted(soak.vectors)
    checked = soak.rng.sample(texts, min(len(texts), 2000))
    for text in checked:
        alone = reference([reference.tokenize(text)])[0]
        if max(abs(float(a) - b) for a, b in zip(alone, soak.vectors[text], strict=True)) > 1e-4:
            soak.wrong.append(f"minilm {text!r}: not the model's vector for it")
    rss = [s["rss"] for s in soak.samples if s["t"] >= 60] or [s["rss"] for s in soak.samples[-1:]]
    growth_mb = (max(rss) - rss[0]) / 1e6 if rss else None
    result = {
        "command": f".venv/bin/python benchmarks/soak.py mixed --duration {args.duration:g}" + (" --every-kind" if args.every_kind else "")
                   + (f" --keep-freed-mb {args.keep_freed_mb}" if args.keep_freed_mb != 512 else ""),
        "statuses": dict(soak.tally), "refusals": soak.refusals, "wrong": len(soak.wrong), "wrong_examples": soak.wrong[:10],
        "lost": sum(v for k, v in soak.tally.items() if k.startswith("no_answer")),
        "minilm_texts": len(texts), "minilm_checked_against_the_model_alone": len(checked), "models": models,
        "rerank_and_classifier_checked_against_the_model_alone": kinds_checked,
        "rss_growth_after_the_first_minute_mb": round(growth_mb, 1) if growth_mb is not None else None,
        "samples": soak.samples,
    }
    result["ok"] = (result["lost"] == 0 and result["wrong"] == 0 and growth_mb is not None and growth_mb <= 50
                    and all(m["worker_deaths"] == 0 and m["queue_depth"] == 0 for m in models.values()))
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: v for k, v in result.items() if k != "samples"}, indent=2))
    sys.exit(0 if result["ok"] else 1)


EVERY_KIND_MODELS = """
[[models]]
name = "rr"
backend = "inferd.backends.transformer:create"
max_batch_size = 16
max_wait_ms = 5
timeout_ms = 20000
[models.options]
model_path = "{rr}"
task = "rerank"
max_tokens = 64
bucket_edges = [32, 64]

[[models]]
name = "clf"
backend = "inferd.backends.transformer:create"
max_batch_size = 16
max_wait_ms = 5
timeout_ms = 20000
cache_bytes = 1048576
[models.options]
model_path = "{clf}"
task = "classification"
max_tokens = 64
bucket_edges = [32, 64]

[[models]]
name = "vit"
backend = "inferd.backends.vision:create"
max_batch_size = 16
max_wait_ms = 5
timeout_ms = 20000
[models.options]
model_path = "{vit}"

[[models]]
name = "gen"
kind = "generation"
backend = "inferd.backends.echo_engine"
timeout_ms = 20000
ttft_slo_ms = 5000
[models.options]
step_ms = 2
max_running = 8
max_tokens = 8
"""


class EveryKind(Mixed):
    """The mixed soak with a model of every kind beside the simulated model and MiniLM: a reranker, a
    classifier, an image embedder and a generation engine, each under closed-loop clients of its own
    route (every 5th input one of 50, as for the others). Checks: the generation engine's text is a
    function of its prompt (checked exactly); the reranker's and the classifier's answers against the
    model called alone through transformers after the run (a sample), the image vectors' size, and every
    repeated input's answer the same as its first."""

    def __init__(self, url: str, duration_s: float, paths: dict[str, str]) -> None:
        super().__init__(url, duration_s)
        self.paths = paths
        self.seen: dict[tuple[str, str], object] = {}  # (model, input) -> its first answer

    def same_as_first(self, model: str, key: str, answer: object, close: float = 1e-4) -> None:
        first = self.seen.setdefault((model, key), answer)
        if first is answer:
            return
        a, b = (first if isinstance(first, list) else [first]), (answer if isinstance(answer, list) else [answer])
        if len(a) != len(b) or any(abs(x - y) > close for x, y in zip(a, b, strict=True)):
            self.wrong.append(f"{model} {key!r}: two answers differ")

    async def kind_client(self, session: aiohttp.ClientSession, model: str, who: str, until: float) -> None:
        import base64
        import io

        from PIL import Image

        from inferd.backends.echo_engine import EchoText, Sampling

        i = 0
        while time.monotonic() < until:
            i += 1
            text = self.text(model, who, i)
            if model == "rr":
                documents = [f"{text} document {k}" for k in range(1 + i % 3)]
                body, path = {"model": "rr", "query": text, "documents": documents}, "/v1/rerank"

                def check(answer: dict, text: str = text, documents: list[str] = documents) -> None:
                    scores = {r["index"]: r["relevance_score"] for r in answer["results"]}
                    if sorted(scores) != list(range(len(documents))):
                        self.wrong.append(f"rr {text!r}: not one score per document")
                    for k, document in enumerate(documents):
                        self.same_as_first("rr", f"{text}\0{document}", scores[k])
            elif model == "clf":
                body, path = {"model": "clf", "input": text}, "/v1/classify"

                def check(answer: dict, text: str = text) -> None:
                    self.same_as_first("clf", text, answer["data"][0]["probs"])
            elif model == "vit":
                shade = (i % 5 == 0) and (i % 50) or i  # (every 5th image one of 50, as the texts)
                image = Image.new("RGB", (32, 32), ((shade * 37) % 256, (shade * 11) % 256, (shade // 7) % 256))
                buffer = io.BytesIO()
                image.save(buffer, "PNG")
                key = f"image {shade}"
                body = {"model": "vit", "input": {"image": base64.b64encode(buffer.getvalue()).decode()}}
                path = "/v1/inference"

                def check(answer: dict, key: str = key) -> None:
                    if not isinstance(answer["output"], list) or len(answer["output"]) != 32:
                        self.wrong.append(f"vit {key}: not a 32-float vector")
                    else:
                        self.same_as_first("vit", key, answer["output"])
            else:
                body, path = {"model": "gen", "prompt": text, "max_tokens": 8}, "/v1/completions"

                def check(answer: dict, text: str = text) -> None:
                    echo = EchoText([ord(c) for c in text], Sampling(1, 8, (), None, 0), False)
                    want = ""
                    while not echo.ended:
                        want += "".join(d.text for d in echo.step())
                    if answer["choices"][0]["text"] != want:
                        self.wrong.append(f"gen {text!r}: not its prompt's echo")
            give_up_s = 0.01 if self.rng.random() < 0.02 else None
            answer = await self.post(session, path, body, PAID if i % 3 == 0 else None, give_up_s)
            if answer is not None:
                self.count(model, "single", answer, check)
                if answer[0] in (429, 503):
                    await asyncio.sleep(min(1.0, answer[1].get("retry_after_ms", 100) / 1000))

    async def run(self, singles: int, callers: int) -> dict:
        until = time.monotonic() + self.duration_s
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=200)) as session:
            extra = asyncio.gather(*(self.kind_client(session, m, f"k{m}{i}", until)
                                     for m in ("rr", "clf", "vit", "gen") for i in range(max(1, singles // 2))))
            models, _ = await asyncio.gather(super().run(singles, callers), extra)
        return models

    def check_against_the_models(self, sample: int = 300) -> int:
        """The reranker's scores and the classifier's probabilities against transformers called alone."""
        import torch
        from transformers import AutoModelForSequenceClassification, AutoTokenizer

        checked = 0
        for model, path in (("rr", self.paths["rr"]), ("clf", self.paths["clf"])):
            tokenizer = AutoTokenizer.from_pretrained(path)
            net = AutoModelForSequenceClassification.from_pretrained(path).eval()
            keys = [k for (m, k) in self.seen if m == model]
            for key in self.rng.sample(keys, min(sample, len(keys))):
                with torch.no_grad():
                    if model == "rr":
                        query, document = key.split("\0")
                        encoded = tokenizer(query, document, truncation=True, max_length=64, return_tensors="pt")
                        want: list[float] = [float(torch.sigmoid(net(**encoded).logits[0, 0]))]
                    else:
                        encoded = tokenizer(key, truncation=True, max_length=64, return_tensors="pt")
                        want = [float(p) for p in torch.softmax(net(**encoded).logits[0], dim=-1)]
                got = self.seen[(model, key)]
                got = got if isinstance(got, list) else [got]
                if any(abs(a - b) > 1e-4 for a, b in zip(want, got, strict=True)):  # type: ignore[arg-type]
                    self.wrong.append(f"{model} {key!r}: not the model's answer for it")
                checked += 1
        return checked


FLOODS_CONFIG = """
[server]
access_log = "off"
grpc_port = {grpc_port}

[auth]
anonymous_tier = "free"

[tiers.free]
rate_per_s = 5
burst = 5

[[models]]
name = "sim"
backend = "inferd.backends.sim:create"
max_batch_size = 64
max_wait_ms = 5
[models.options]
latency_ms = 10
max_batch_size = 64

[[models]]
name = "minilm"
backend = "inferd.backends.transformer:create"
max_batch_size = 8
"""


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:")) / 1024


def metrics_bytes(url: str) -> int:
    with urllib.request.urlopen(f"{url}/metrics", timeout=30) as resp:
        return len(resp.read())


def grpc_flood(address: str, calls: int, metadata: tuple, made_up: bool) -> Counter:
    """`calls` ModelInfer calls from 4 threads (made-up model names, or the real one with `metadata`)."""
    import concurrent.futures

    import grpc
    from tritonclient.grpc import service_pb2 as pb
    from tritonclient.grpc import service_pb2_grpc as pb_grpc

    def some(offset: int) -> Counter:
        seen: Counter = Counter()
        with grpc.insecure_channel(address) as channel:
            stub = pb_grpc.GRPCInferenceServiceStub(channel)
            for i in range(offset, calls, 4):
                name = f"made-up-{i}" if made_up else "sim"
                try:
                    stub.ModelInfer(pb.ModelInferRequest(model_name=name), metadata=metadata, timeout=10)
                    seen["OK"] += 1
                except grpc.RpcError as error:
                    seen[error.code().name] += 1
        return seen

    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        return sum(pool.map(some, range(4)), Counter())


async def http_names_flood(url: str, calls: int) -> Counter:
    seen: Counter = Counter()
    async with aiohttp.ClientSession() as session:
        async def some(offset: int) -> None:
            for i in range(offset, calls, 16):
                async with session.post(f"{url}/v1/inference", json={"model": f"made-up-{i}", "input": "x"}) as resp:
                    seen[resp.status] += 1
                    await resp.read()
        await asyncio.gather(*(some(k) for k in range(16)))
    return seen


async def warm_answers(url: str, calls: int) -> Counter:
    seen: Counter = Counter()
    async with aiohttp.ClientSession() as session:
        for i in range(calls):
            for path, body in (("/v1/inference", {"model": "sim", "input": f"warm {i}"}),
                               ("/tokenize", {"model": "minilm", "inputs": f"warm {i}"})):
                async with session.post(f"{url}{path}", json=body) as resp:
                    seen[resp.status] += 1
                    await resp.read()
    return seen


async def pipelined_flood(url: str, seconds: float, connections: int = 4) -> Counter:
    """Clients that write ~100 KB requests back to back on a keep-alive connection and never read."""
    host, port = url.removeprefix("http://").split(":")
    body = json.dumps({"input": "p" * 100_000}).encode()
    request = (f"POST /v1/inference HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    seen: Counter = Counter()

    async def one() -> None:
        reader, writer = await asyncio.open_connection(host, int(port))
        until = time.monotonic() + seconds
        try:
            while time.monotonic() < until:
                writer.write(request)
                try:
                    await asyncio.wait_for(writer.drain(), timeout=max(0.01, until - time.monotonic()))
                except (TimeoutError, ConnectionError):
                    break
                seen["sent"] += 1
        finally:
            writer.transport.abort()

    await asyncio.gather(*(one() for _ in range(connections)))
    return seen


async def tokenize_flood(url: str, seconds: float) -> Counter:
    seen: Counter = Counter()
    text = "token " * 150_000  # ~0.9 MB
    async with aiohttp.ClientSession() as session:
        until = time.monotonic() + seconds

        async def one() -> None:
            while time.monotonic() < until:
                async with session.post(f"{url}/tokenize", json={"model": "minilm", "inputs": text}) as resp:
                    seen[resp.status] += 1
                    await resp.read()
        await asyncio.gather(*(one() for _ in range(8)))
    return seen


def floods_main(argv: list[str]) -> None:
    """The floods of issue 79 and the server's memory after each (see the module's docstring)."""
    from common import free_port, inferd_process

    parser = argparse.ArgumentParser(prog="soak.py floods", description=floods_main.__doc__)
    parser.add_argument("--settle", type=float, default=10.0, help="seconds after a flood before its RSS is read")
    parser.add_argument("--out", default=str(RESULTS / "soak_floods.json"))
    args = parser.parse_args(argv)
    grpc_port = free_port()
    floods = {
        "grpc_made_up_models": lambda url: grpc_flood(f"127.0.0.1:{grpc_port}", 5000, (), True),
        "grpc_unknown_key": lambda url: grpc_flood(f"127.0.0.1:{grpc_port}", 2000, (("authorization", "Bearer no-such-key"),), False),
        "http_made_up_models": lambda url: asyncio.run(http_names_flood(url, 5000)),
        "pipelined_never_read": lambda url: asyncio.run(pipelined_flood(url, 8.0)),
        "tokenize_free_tier": lambda url: asyncio.run(tokenize_flood(url, 10.0)),
    }
    rows = []
    with inferd_process(FLOODS_CONFIG.format(grpc_port=grpc_port)) as (url, pid):
        # (warm: the first answers' own allocations and series are no flood's: made-up names, real
        # answers, and the free tier's first refusals past its rate)
        asyncio.run(http_names_flood(url, 64))
        asyncio.run(warm_answers(url, 40))
        time.sleep(args.settle)
        for name, flood in floods.items():
            before, before_metrics = rss_mb(pid), metrics_bytes(url)
            peak = [before]
            stop = [False]

            def sample() -> None:
                while not stop[0]:
                    peak.append(rss_mb(pid))
                    time.sleep(0.25)

            import threading

            sampler = threading.Thread(target=sample)
            sampler.start()
            started = time.monotonic()
            answers = flood(url)
            took = time.monotonic() - started
            time.sleep(args.settle)
            stop[0] = True
            sampler.join()
            after, after_metrics = rss_mb(pid), metrics_bytes(url)
            row = {"flood": name, "seconds": round(took, 1), "answers": {str(k): v for k, v in answers.items()},
                   "rss_before_mb": round(before, 1), "rss_peak_mb": round(max(peak), 1), "rss_after_mb": round(after, 1),
                   "metrics_bytes_before": before_metrics, "metrics_bytes_after": after_metrics,
                   "passed": after - before <= 50 and after_metrics <= 1.1 * before_metrics}
            rows.append(row)
            print(json.dumps(row), flush=True)
    result = {"floods": rows, "passed": all(r["passed"] for r in rows)}
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(f"floods: {'passed' if result['passed'] else 'FAILED'}; {args.out}")


if __name__ == "__main__":
    modes = {"faults": faults_main, "memory": memory_main, "mixed": mixed_main, "floods": floods_main}
    if len(sys.argv) < 2 or sys.argv[1] not in modes:
        sys.exit(f"usage: soak.py {{faults|memory|mixed|floods}} [options] (--help after the mode for its options)\n\n{__doc__}")
    modes[sys.argv[1]](sys.argv[2:])
