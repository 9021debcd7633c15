"""S7, generation: N concurrent streaming clients (1, 8, 32) against inferd and against vLLM's AsyncLLM
called directly in one process, in one run: tokens/s, time to first token p50/p99, time per output
token. The ratio inferd/direct is the server's overhead on generation.

The model is the tiny random-weight Llama (built on the spot; the CPU has no hub), so absolute figures
are small; the ratio is the point. Each client sends requests of 64 output tokens back to back.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import time
from pathlib import Path

import aiohttp
import orjson
from common import inferd_server, parse_args

from inferd.backends.tiny_llama import build_tiny_llama
from inferd.bench.runner import percentile

TOKENS = 64
OPTIONS = {"dtype": "float32", "max_model_len": 256, "kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 32}


def summarise(records: list[tuple[float, float, int]], wall_s: float) -> dict:
    """records: (ttft_s, total_s, tokens) per request."""
    ttfts = sorted(r[0] * 1000 for r in records)
    tpots = sorted((r[1] - r[0]) / max(1, r[2] - 1) * 1000 for r in records)
    tokens = sum(r[2] for r in records)
    return {"requests": len(records), "tokens_per_s": round(tokens / wall_s, 1),
            "ttft_p50_ms": round(percentile(ttfts, 50), 2), "ttft_p99_ms": round(percentile(ttfts, 99), 2),
            "tpot_p50_ms": round(percentile(tpots, 50), 3)}


async def direct(model_path: str, clients: int, duration_s: float) -> dict:
    from inferd.backends.vllm import VllmEngine

    engine = VllmEngine({"model_path": model_path, **OPTIONS})
    await asyncio.get_running_loop().run_in_executor(None, engine.start)
    results = {}
    try:
        for n in clients:
            records: list[tuple[float, float, int]] = []
            prompt = engine.encode("The batching server gathers requests")
            end = time.monotonic() + duration_s

            async def client(c: int) -> None:
                i = 0
                while time.monotonic() < end:
                    sampling = engine.sampling({"max_tokens": TOKENS, "ignore_eos": True, "seed": i})
                    started = time.monotonic()
                    first, count = 0.0, 0
                    async for d in engine.generate(prompt, sampling, f"d{n}-{c}-{i}", 0):
                        if not first:
                            first = time.monotonic() - started
                        count += d.token_count
                    records.append((first, time.monotonic() - started, count))
                    i += 1

            began = time.monotonic()
            await asyncio.gather(*(client(c) for c in range(n)))
            results[n] = summarise(records, time.monotonic() - began)
            print(f"direct  {n:3d} clients: {results[n]}")
    finally:
        engine.shutdown()
    return results


async def through_inferd(url: str, clients: list[int], duration_s: float) -> dict:
    results = {}
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for n in clients:
            records: list[tuple[float, float, int]] = []
            end = time.monotonic() + duration_s

            async def client(c: int) -> None:
                i = 0
                while time.monotonic() < end:
                    body = {"model": "tiny", "input": "The batching server gathers requests", "stream": True,
                            "max_tokens": TOKENS, "ignore_eos": True, "seed": i}
                    started = time.monotonic()
                    first, count = 0.0, 0
                    async with session.post(f"{url}/v1/inference", json=body) as resp:
                        async for line in resp.content:
                            if line.startswith(b"data: "):
                                if not first:
                                    first = time.monotonic() - started
                                event = orjson.loads(line[6:])
                                if event.get("done"):
                                    count = event["usage"]["completion_tokens"]
                    records.append((first, time.monotonic() - started, count))
                    i += 1

            began = time.monotonic()
            await asyncio.gather(*(client(c) for c in range(n)))
            results[n] = summarise(records, time.monotonic() - began)
            print(f"inferd  {n:3d} clients: {results[n]}")
    return results


if __name__ == "__main__":
    args = parse_args(__doc__)
    duration = 4.0 if args.quick else 15.0
    clients = [1, 8, 32]
    with tempfile.TemporaryDirectory() as tmp:
        model_path = str(build_tiny_llama(Path(tmp) / "tiny"))
        direct_results = asyncio.run(direct(model_path, clients, duration))
        options = "\n".join(f"{k} = {v}" if not isinstance(v, str) else f'{k} = "{v}"' for k, v in OPTIONS.items())
        config = f"""
[server]
access_log = "off"

[[models]]
name = "tiny"
kind = "generation"
backend = "inferd.backends.vllm"
max_waiting_requests = 64
[models.options]
model_path = "{model_path}"
{options}
"""
        with inferd_server(config) as url:
            inferd_results = asyncio.run(through_inferd(url, clients, duration))
    rows = ["### S7: generation, tiny Llama on CPU: inferd vs AsyncLLM direct (64 output tokens per request)", "",
            "| clients | direct tok/s | inferd tok/s | ratio | TTFT p50 direct / inferd ms | TTFT p99 direct / inferd ms "
            "| TPOT p50 direct / inferd ms |",
            "|---|---|---|---|---|---|---|"]
    for n in clients:
        d, i = direct_results[n], inferd_results[n]
        rows.append(f"| {n} | {d['tokens_per_s']} | {i['tokens_per_s']} | {i['tokens_per_s'] / d['tokens_per_s']:.2f} | "
                    f"{d['ttft_p50_ms']} / {i['ttft_p50_ms']} | {d['ttft_p99_ms']} / {i['ttft_p99_ms']} | "
                    f"{d['tpot_p50_ms']} / {i['tpot_p50_ms']} |")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "S7.json").write_text(json.dumps({"direct": direct_results, "inferd": inferd_results}, indent=2) + "\n")
    (out / "S7.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))
