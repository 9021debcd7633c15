"""S12, identical work computed once: Zipf-distributed inputs at twice capacity, with collapsing off, on,
and on with the result cache, side by side in one run.

Inputs are drawn from 10,000 distinct texts with Zipf's law (s = 1.1: the most common text is about
10% of requests), open-loop Poisson arrivals at twice the model's capacity, each request with a 1 s
deadline. Two workloads: the seed's (simulated GPU, 100 ms per batch of up to 100: 1,000 req/s) and
all-MiniLM-L6-v2 computing on this machine's CPU (its capacity measured first, with distinct inputs).

Goodput is the answers given (200, inside their deadline) per second. Every answer is checked: the
seed's against `expected_output` of the text sent, MiniLM's against the same text embedded directly
by the backend afterwards (largest difference 1e-4), so an answer that belongs to another input counts
as wrong.
"""

from __future__ import annotations

import asyncio
import base64
import json
import multiprocessing
import random
import time
from bisect import bisect_left
from collections import Counter
from itertools import accumulate
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import orjson
from common import _machine, inferd_server, parse_args, step

from inferd.backends.sim import expected_output
from inferd.bench.loadgen import open_loop

DISTINCT, ZIPF_S, TIMEOUT_MS, PROCESSES = 10_000, 1.1, 1000, 2
VARIANTS = (("off", "collapse = false"), ("collapsing", "collapse = true"),
            ("collapsing + cache", "collapse = true\ncache_bytes = 268435456\ncache_ttl_s = 600"))
MINILM_OPTIONS = "[models.options]\nmax_tokens = 128\nbucket_edges = [16, 32, 64, 128]\n"


def text_of(rank: int) -> str:
    return f"query {rank}: how do I keep a batching server fed?"


def config(model: str, variant: str) -> str:
    if model == "seed":
        return (f'[server]\naccess_log = "off"\n\n[[models]]\nname = "m"\nbackend = "inferd.backends.sim:create"\n'
                f"max_batch_size = 100\nmax_wait_ms = 20\nmax_queue = 4000\n{variant}\n"
                "[models.options]\nlatency_ms = 100\nmax_batch_size = 100\n")
    return (f'[server]\naccess_log = "off"\n\n[[models]]\nname = "m"\nbackend = "inferd.backends.transformer:create"\n'
            f"max_batch_size = 32\nmax_wait_ms = 5\nmax_queue = 4000\n{variant}\n{MINILM_OPTIONS}")


async def _drive(url: str, rate: float, warmup_s: float, duration_s: float, seed: int, vectors: bool) -> dict[str, Any]:
    """One process's share: Zipf inputs at `rate`, every answer checked (or, for vectors, kept per text)."""
    cdf = list(accumulate(1.0 / k**ZIPF_S for k in range(1, DISTINCT + 1)))
    cdf = [c / cdf[-1] for c in cdf]
    draw, arrivals = random.Random(seed), random.Random(seed + 1)
    loop = asyncio.get_running_loop()
    began = loop.time()
    measured_from, end = began + warmup_s, began + warmup_s + duration_s
    out: dict[str, Any] = {"statuses": Counter(), "latencies_ms": [], "wrong": 0, "shared": Counter(), "sent": 0,
                           "vectors": {}}

    async def send(session: aiohttp.ClientSession, scheduled: float) -> None:
        rank = bisect_left(cdf, draw.random()) + 1
        text = text_of(rank)
        body = {"input": text, "timeout_ms": TIMEOUT_MS, **({"encoding_format": "base64"} if vectors else {})}
        counted = scheduled >= measured_from
        try:
            async with session.post(url, data=orjson.dumps(body), headers={"Content-Type": "application/json"}) as resp:
                payload, status, timing = await resp.read(), resp.status, resp.headers.get("Server-Timing", "")
        except (aiohttp.ClientError, OSError, TimeoutError):
            status, payload, timing = 0, b"", ""
        if not counted:
            return
        out["sent"] += 1
        out["statuses"][str(status)] += 1
        if status != 200:
            return
        now = loop.time()
        if now <= end + TIMEOUT_MS / 1000:
            out["latencies_ms"].append((now - scheduled) * 1000)
        out["shared"]["cache" if "cache" in timing else "collapsed" if "collapsed" in timing else "computed"] += 1
        output = orjson.loads(payload)["output"]
        if not vectors:
            out["wrong"] += output != expected_output(text)
            return
        vector = np.frombuffer(base64.b64decode(output), dtype="<f4")
        first = out["vectors"].setdefault(rank, vector)
        out["wrong"] += float(np.max(np.abs(first - vector))) > 1e-4

    connector = aiohttp.TCPConnector(limit=1000)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=30)) as session:
        await open_loop(rate, warmup_s + duration_s, arrivals, lambda _, scheduled: send(session, scheduled), began=began)
    out["vectors"] = {rank: v.tobytes() for rank, v in out["vectors"].items()}
    return out


def _drive_process(*args: Any) -> dict[str, Any]:
    return asyncio.run(_drive(*args))


def drive(url: str, rate: float, warmup_s: float, duration_s: float, vectors: bool) -> dict[str, Any]:
    with multiprocessing.get_context("spawn").Pool(PROCESSES) as pool:
        parts = pool.starmap(_drive_process, [(f"{url}/v1/inference", rate / PROCESSES, warmup_s, duration_s, 100 + i,
                                               vectors) for i in range(PROCESSES)])
    merged: dict[str, Any] = {"statuses": Counter(), "latencies_ms": [], "wrong": 0, "shared": Counter(), "sent": 0,
                              "vectors": {}}
    for part in parts:
        for key in ("statuses", "shared"):
            merged[key].update(part[key])
        merged["latencies_ms"] += part["latencies_ms"]
        merged["wrong"] += part["wrong"]
        merged["sent"] += part["sent"]
        for rank, raw in part["vectors"].items():  # the first vector of each text, from either process
            merged["vectors"].setdefault(rank, []).append(np.frombuffer(raw, dtype="<f4"))
    return merged


def wrong_vectors(vectors: dict[int, list[np.ndarray]]) -> int:
    """Texts whose served vector differs from the text embedded directly by the backend (in batches of 32)."""
    from inferd.backends.transformer import TextModel

    model = TextModel("cpu", {"max_tokens": 128, "bucket_edges": [16, 32, 64, 128]})
    ranks = sorted(vectors)
    wrong = 0
    for start in range(0, len(ranks), 32):
        chunk = ranks[start:start + 32]
        prepared = model.prepare_batch([text_of(r) for r in chunk])
        by_bucket: dict[int, list[int]] = {}
        for i, p in enumerate(prepared):
            by_bucket.setdefault(p.bucket, []).append(i)
        for indices in by_bucket.values():
            outputs = model([prepared[i].input for i in indices])
            for i, output in zip(indices, outputs, strict=True):
                wrong += sum(float(np.max(np.abs(v - np.asarray(output)))) > 1e-4 for v in vectors[chunk[i]])
    return wrong


def summarise(model: str, variant: str, offered: float, duration_s: float, run: dict[str, Any], wrong: int) -> dict:
    lat = sorted(run["latencies_ms"])
    ok = run["statuses"].get("200", 0)
    pct = (lambda q: round(lat[min(len(lat) - 1, int(q * len(lat)))], 1)) if lat else (lambda q: None)
    return {"workload": model, "variant": variant, "offered_rps": round(offered, 1), "sent": run["sent"],
            "goodput_rps": round(ok / duration_s, 1), "p50_ms": pct(0.5), "p99_ms": pct(0.99),
            "statuses": dict(run["statuses"]), "answers": dict(run["shared"]), "wrong_answers": wrong}


def minilm_capacity(quick: bool) -> float:
    """Requests per second the MiniLM server sustains with distinct inputs and collapsing off."""
    with inferd_server(config("minilm", "collapse = false")) as url:
        body = b'{"input": "query {i}: how do I keep a batching server fed?"}'
        result = step(url, clients=64, duration_s=10, quick=quick, body=body, engine="python", processes=PROCESSES)
    return float(result["achieved_rps"])


def table(rows: list[dict]) -> str:
    lines = ["| workload | variant | offered req/s | goodput req/s | × off | p50 ms | p99 ms | computed / collapsed / cached "
             "answers | 503 | 504 | wrong answers |", "|" + "---|" * 11]
    for r in rows:
        off = next(o for o in rows if o["workload"] == r["workload"] and o["variant"] == "off")
        a, s = r["answers"], r["statuses"]
        lines.append(f"| {r['workload']} | {r['variant']} | {r['offered_rps']:,.0f} | {r['goodput_rps']:,.1f} | "
                     f"{r['goodput_rps'] / max(off['goodput_rps'], 1e-9):.2f} | {r['p50_ms']} | {r['p99_ms']} | "
                     f"{a.get('computed', 0):,} / {a.get('collapsed', 0):,} / {a.get('cache', 0):,} | "
                     f"{s.get('503', 0):,} | {s.get('504', 0):,} | {r['wrong_answers']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    args = parse_args(__doc__)
    warmup_s, duration_s = (1.0, 4.0) if args.quick else (3.0, 20.0)
    capacity = {"seed": 1000.0, "minilm": minilm_capacity(args.quick)}
    rows = []
    for model in ("seed", "minilm"):
        for variant, settings in VARIANTS:
            with inferd_server(config(model, settings)) as url:
                started = time.monotonic()
                run = drive(url, 2 * capacity[model], warmup_s, duration_s, vectors=model == "minilm")
                wrong = run["wrong"] + (wrong_vectors(run["vectors"]) if model == "minilm" else 0)
                rows.append(summarise(model, variant, 2 * capacity[model], duration_s, run, wrong))
                print(rows[-1], f"({time.monotonic() - started:.0f} s)", flush=True)
    out = Path(args.out_dir)
    meta = {"title": "S12: Zipf inputs at 2x capacity, collapsing off / on / on + cache", "machine": _machine(),
            "distinct_inputs": DISTINCT, "zipf_s": ZIPF_S, "timeout_ms": TIMEOUT_MS, "duration_s": duration_s,
            "capacity_rps": capacity}
    (out / "S12.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    summary = {m: {r["variant"]: round(r["goodput_rps"] / next(o["goodput_rps"] for o in rows if o["workload"] == m
                                                                 and o["variant"] == "off"), 2)
                   for r in rows if r["workload"] == m} for m in capacity}
    text = f"### {meta['title']}\n\n{table(rows)}\n\ngoodput over collapsing off: {summary}\n"
    (out / "S12.md").write_text(text)
    print(text)
