"""Admission beside a tenant's big calls: is a small call with a deadline refused, or admitted and in time?

One tenant, the seed's workload (50 ms a batch of up to 8, one worker: 160 inputs/s). Two closed-loop
clients send 64-input calls (Open Inference Protocol BYTES tensors, no deadline) and keep ~16 batches
(~0.8 s) queued; a third sends a 4-input call with a 600 ms deadline every 100 ms after its last answer.
The queue serves a tenant's calls in turns (a 4-input call's inputs go in the next 2-3 batches), so
each small call can finish in time; admission must predict that, not the ~0.8 s a FIFO would take.
Counted per small call: 200 in time, 503 refused, 504 late, other; and the big calls' inputs/s.
With `--baseline-tree` the same against an earlier checkout, alternated round by round.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from common import inferd_server, parse_args, sim_config

SECONDS = 15.0


def v2_body(prefix: str, n: int, timeout_ms: int | None = None) -> dict[str, Any]:
    body: dict[str, Any] = {"inputs": [{"name": "text", "datatype": "BYTES", "shape": [n],
                                        "data": [f"{prefix}-{i}" for i in range(n)]}]}
    if timeout_ms is not None:
        body["parameters"] = {"timeout": timeout_ms * 1000}
    return body


async def run(url: str, seconds: float) -> dict[str, Any]:
    import aiohttp

    stop = time.monotonic() + seconds
    outcomes: dict[str, int] = {}
    small_ms: list[float] = []
    big_inputs = 0
    serial = iter(range(10**9))

    async def big(http: aiohttp.ClientSession) -> None:
        nonlocal big_inputs
        while time.monotonic() < stop:
            async with http.post(f"{url}/v2/models/batchstring/infer", json=v2_body(f"b{next(serial)}", 64)) as resp:
                await resp.read()
                big_inputs += 64 if resp.status == 200 else 0

    async def small(http: aiohttp.ClientSession) -> None:
        await asyncio.sleep(1.0)  # the big calls' backlog first
        while time.monotonic() < stop:
            started = time.monotonic()
            async with http.post(f"{url}/v2/models/batchstring/infer", json=v2_body(f"s{next(serial)}", 4, 600)) as resp:
                await resp.read()
                key = {200: "in_time", 503: "refused", 504: "late"}.get(resp.status, f"status_{resp.status}")
            outcomes[key] = outcomes.get(key, 0) + 1
            if resp.status == 200:
                small_ms.append((time.monotonic() - started) * 1000)
            await asyncio.sleep(0.1)

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(big(http), big(http), small(http))
    small_ms.sort()
    return {"small_calls": outcomes, "small_p50_ms": round(statistics.median(small_ms), 1) if small_ms else None,
            "small_max_ms": round(small_ms[-1], 1) if small_ms else None,
            "big_inputs_per_s": round(big_inputs / seconds, 1)}


def main() -> None:
    args = parse_args(__doc__, baseline=True)
    seconds = 5.0 if args.quick else SECONDS
    config = sim_config(latency_ms=50, max_batch=8, max_wait_ms=5, max_queue=4000)
    trees = {"this checkout": None, **({"baseline": args.baseline_tree} if args.baseline_tree else {})}
    rounds = []
    for _ in range(1 if args.quick else 2):
        for name, tree in trees.items():
            with inferd_server(config, **({"tree": tree} if tree else {})) as url:
                result = asyncio.run(run(url, seconds))
            result["tree"] = name
            rounds.append(result)
            print(json.dumps(result), flush=True)
    lines = ["### A small call with a deadline beside one tenant's big calls (admission by the turns)", "",
             "| round | checkout | small calls: in time / refused 503 / late 504 / other | small p50 / max ms | "
             "big calls' inputs/s |", "|---|---|---|---|---|"]
    for i, r in enumerate(rounds):
        o = r["small_calls"]
        other = sum(n for key, n in o.items() if key.startswith("status_"))
        lines.append(f"| {i // len(trees) + 1} | {r['tree']} | {o.get('in_time', 0)} / {o.get('refused', 0)} / "
                     f"{o.get('late', 0)} / {other} | {r['small_p50_ms']} / {r['small_max_ms']} | {r['big_inputs_per_s']} |")
    out = Path(args.out_dir)
    (out / "call_turns_admission.json").write_text(json.dumps(rounds, indent=1) + "\n")
    (out / "call_turns_admission.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
