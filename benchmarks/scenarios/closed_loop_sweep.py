"""The seed's workload at every concurrency (issue 74): closed-loop clients from 1 to 1,000, with wrk
and with the project's Python load generator, against one batch per cycle (the ideal: N clients in one
batch a cycle, N / (batch time + ~2 ms of turnaround), at most max_batch_size / batch time), on this
checkout, on `--baseline-tree` where given, and on Mosec 0.9.8 with the same function and linger (wrk),
all in the same run. Every request's body is distinct (`{i}`).

Beside them, one batch per cycle on the floor of the front end, with each client
(`benchmarks/floor/one_batch_per_cycle.py`: a bare aiohttp + uvloop + orjson server told N, that
gathers exactly N requests a batch): what this host and this client allow at most, since the ~2 ms
turnaround is wrk's alone and a loaded Python client takes 10-25 ms to trade 50-100 answers for the
next requests. inferd's share of it is the batching rule's own loss.

`--hogs N`: N busy processes per core beside every server all through (other work on a shared host);
`--clients 10,100`: those steps only. The results' name then says so (`closed_loop_sweep_100ms_hogs1`).
`--rounds N`: the whole sequence N times, its order reversed every other round, each figure the median.

`--model minilm`: the same sweep on a real model, all-MiniLM-L6-v2 on this CPU through OpenAI's
`/embeddings` (the default config's settings: batches of up to 32, linger 5 ms, length buckets), beside
Infinity 0.0.78 serving the same folder with the same batch size, in the same run. Its ideal is one batch
per cycle at the model's own time for that batch, measured first in this run (the backend called in a
loop, no server): N / (t(N) + 2 ms) up to 32 clients, 32 / t(32) past them.

    .venv/bin/python benchmarks/scenarios/closed_loop_sweep.py --batch-ms 100 [--baseline-tree DIR]
        [--hogs N] [--clients LIST] [--rounds N]
    .venv/bin/python benchmarks/scenarios/closed_loop_sweep.py --model minilm [--clients LIST]
"""

from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager

from common import (
    REPO,
    RESULTS,
    free_port,
    inferd_server,
    infinity_server,
    mosec_server,
    own_option,
    parse_args,
    save_table,
    sim_config,
    start_hogs,
    step,
    stop_hogs,
    wait_answering,
)

CLIENTS = (1, 2, 5, 10, 20, 50, 100, 200, 400, 1000)
BODY = b'{"input": "E equals {i}"}'
TURNAROUND_S = 0.002


def ideal(clients: int, batch_s: float) -> float:
    return min(clients / (batch_s + TURNAROUND_S), 100 / batch_s)


def row(result: dict) -> dict:
    server = result.get("server") or {}
    return {"rps": result["achieved_rps"], "p50": result["latency_ms"]["p50"], "p90": result["latency_ms"]["p90"],
            "p99": result["latency_ms"]["p99"], "batch": server.get("mean_batch_size")}


def sweep(url: str, engines: tuple[str, ...], quick: bool, duration_s: float, stats: bool = True) -> dict:
    found = {}
    for clients in CLIENTS:
        for engine in engines:
            result = step(url, clients=clients, duration_s=duration_s, quick=quick, engine=engine, body=BODY,
                          timeout_s=60, stats_path="/v1/stats" if stats else None,
                          path="/v1/inference" if stats else "/inference", warmup_s=1.5)
            found[f"{clients} {engine}"] = row(result)
            print(clients, engine, found[f"{clients} {engine}"], file=sys.stderr, flush=True)
    return found


def median_rows(runs: list[dict]) -> dict:
    """Each step's figures, the median of the rounds' (one round: as measured)."""
    return {key: {field: (statistics.median(values) if None not in (values := [run[key][field] for run in runs]) else None)
                  for field in runs[0][key]} for key in runs[0]}


@contextmanager
def floor_server(clients: int, batch_ms: float) -> Iterator[str]:
    """The one-batch-per-cycle floor told `clients`, on a free port; yields its base URL."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "floor" / "one_batch_per_cycle.py"), "--port",
                             str(port), "--clients", str(clients), "--batch-ms", str(batch_ms)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(url, "the one-batch-per-cycle floor")
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def floor_sweep(batch_ms: float, quick: bool, duration_s: float) -> dict:
    found = {}
    for clients in CLIENTS:
        with floor_server(clients, batch_ms) as url:
            for engine in ("wrk", "python"):
                result = step(url, clients=clients, duration_s=duration_s, quick=quick, engine=engine, body=BODY,
                              timeout_s=60, stats_path=None, warmup_s=1.5)
                found[f"{clients} {engine}"] = row(result)
                print(clients, engine, "floor", found[f"{clients} {engine}"], file=sys.stderr, flush=True)
    return found


MINILM_CLIENTS = (1, 2, 5, 10, 16, 20, 32, 50, 64, 100)
MINILM_BODY = b'{"model": "minilm", "input": "request {i}: a sentence of ordinary length to embed for the benchmark"}'
MINILM_BATCH = 32
MINILM_CONFIG = f"""
[server]
access_log = "off"

[[models]]
name = "minilm"
backend = "inferd.backends.transformer:create"
max_batch_size = {MINILM_BATCH}
max_wait_ms = 5
max_queue = 4000
timeout_ms = 30000
[models.options]
dtype = "float32"
max_tokens = 256
bucket_edges = [16, 32, 64, 128, 256]
"""


def minilm_batch_s(sizes: list[int], quick: bool) -> dict[int, float]:
    """The model's own seconds a batch of each size on this host: the backend called in a loop."""
    from inferd.backends.transformer import TextModel

    model = TextModel("cpu", {"max_tokens": 256, "bucket_edges": [16, 32, 64, 128, 256]})
    model.warmup()
    text = MINILM_BODY.decode().split('"input": "')[1].rstrip('"}')
    rows = [model.tokenize(text.replace("{i}", str(i))) for i in range(max(sizes))]
    times = {}
    for size in sizes:
        batch = rows[:size]
        model(batch)
        calls, started = 0, time.perf_counter()
        while time.perf_counter() - started < (0.5 if quick else 2.0):
            model(batch)
            calls += 1
        times[size] = (time.perf_counter() - started) / calls
    del model
    return times


def minilm_ideal(clients: int, batch_s: dict[int, float]) -> float:
    if clients >= MINILM_BATCH:
        return MINILM_BATCH / batch_s[MINILM_BATCH]
    return clients / (batch_s[clients] + TURNAROUND_S)


def minilm_sweep(url: str, path: str, stats: bool, quick: bool, duration_s: float) -> dict:
    found = {}
    for clients in CLIENTS:
        for engine in ("wrk", "python"):
            result = step(url, clients=clients, duration_s=duration_s, quick=quick, engine=engine, body=MINILM_BODY,
                          timeout_s=60, stats_path="/v1/stats" if stats else None, path=path, warmup_s=2.0)
            found[f"{clients} {engine}"] = row(result)
            print(clients, engine, path, found[f"{clients} {engine}"], file=sys.stderr, flush=True)
    return found


def minilm_main(quick: bool, out_dir: str) -> None:
    batch_s = minilm_batch_s(sorted({min(c, MINILM_BATCH) for c in CLIENTS}), quick)
    print("the model's own ms a batch:", {n: round(t * 1000, 1) for n, t in batch_s.items()}, file=sys.stderr)
    results: dict[str, dict] = {}
    with inferd_server(MINILM_CONFIG) as url:
        results["inferd"] = minilm_sweep(url, "/v1/embeddings", True, quick, 8.0)
    from inferd.backends.transformer import default_model_path

    with infinity_server(default_model_path(), MINILM_BATCH) as infinity:
        if infinity is not None:
            results["infinity"] = minilm_sweep(infinity, "/embeddings", False, quick, 8.0)
    head = ["clients", "model's own ms a batch", "ideal req/s"] + [
        f"{n} {e}: req/s (of ideal), p50 / p99 ms (p99 / p50), batch" for n in results for e in ("wrk", "python")]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for clients in CLIENTS:
        best = minilm_ideal(clients, batch_s)
        cells = [str(clients), f"{batch_s[min(clients, MINILM_BATCH)] * 1000:.1f}", f"{best:.0f}"]
        for n in results:
            for e in ("wrk", "python"):
                r = results[n][f"{clients} {e}"]
                batch = f", {r['batch']:.1f}" if r.get("batch") else ""
                cells.append(f"{r['rps']:.1f} ({r['rps'] / best:.2f}), {r['p50']:.0f} / {r['p99']:.0f} "
                             f"({r['p99'] / max(r['p50'], 1e-9):.1f}){batch}")
                rows.append({"clients": clients, "server": n, "engine": e, **r, "ideal": best,
                             "model_batch_ms": batch_s[min(clients, MINILM_BATCH)] * 1000})
        lines.append("| " + " | ".join(cells) + " |")
    title = ("Closed loop at every concurrency on all-MiniLM-L6-v2 (CPU, float32, batches of up to 32) through "
             "OpenAI's /embeddings, inferd beside Infinity 0.0.78 (of ideal: of one batch per cycle at the model's "
             "own time for that batch, measured first in this run)")
    save_table("closed_loop_sweep_minilm", title, rows, lines, out_dir)


if __name__ == "__main__":
    if own_option("--model") == "minilm":
        chosen = own_option("--clients")
        CLIENTS = tuple(int(c) for c in chosen.split(",")) if chosen else MINILM_CLIENTS
        minilm_args = parse_args(__doc__)
        minilm_main(minilm_args.quick, minilm_args.out_dir or str(RESULTS))
        sys.exit(0)
    batch_ms = float(own_option("--batch-ms") or 100)
    hogs_per_core = int(own_option("--hogs") or 0)
    chosen = own_option("--clients")
    if chosen:
        CLIENTS = tuple(int(c) for c in chosen.split(","))
    rounds = int(own_option("--rounds") or 1)
    args = parse_args(__doc__, baseline=True)
    duration = 6.0
    found: dict[str, list[dict]] = {}
    hogs = start_hogs(hogs_per_core) if hogs_per_core else []
    try:
        for number in range(rounds):
            parts = ["inferd", "baseline", "floor", "mosec"]
            for part in parts if number % 2 == 0 else parts[::-1]:  # (alternated: this host drifts by 10-20%)
                if part == "inferd":
                    with inferd_server(sim_config(latency_ms=batch_ms)) as url:
                        found.setdefault(part, []).append(sweep(url, ("wrk", "python"), args.quick, duration))
                elif part == "baseline" and args.baseline_tree:
                    with inferd_server(sim_config(latency_ms=batch_ms), tree=args.baseline_tree) as url:
                        found.setdefault(part, []).append(sweep(url, ("wrk", "python"), args.quick, duration))
                elif part == "floor":
                    found.setdefault(part, []).append(floor_sweep(batch_ms, args.quick, duration))
                elif part == "mosec":
                    with mosec_server(args.quick, batch_ms) as mosec:
                        if mosec is not None:
                            found.setdefault(part, []).append(sweep(mosec[0], ("wrk",), args.quick, duration, stats=False))
    finally:
        stop_hogs(hogs)
    results = {part: median_rows(runs) for part, runs in found.items()}
    batch_s = batch_ms / 1000
    names = [n for n in ("inferd", "baseline", "floor", "mosec") if n in results]
    head = ["clients", "ideal req/s"] + [f"{n} {e}: req/s (of ideal; of the floor), p50 / p90 ms, batch" for n in names
                                         for e in (("wrk", "python") if n != "mosec" else ("wrk",))]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    rows = []
    for clients in CLIENTS:
        cells = [str(clients), f"{ideal(clients, batch_s):.0f}"]
        for n in names:
            for e in (("wrk", "python") if n != "mosec" else ("wrk",)):
                r = results[n][f"{clients} {e}"]
                floor = results["floor"][f"{clients} {e}"]["rps"]
                batch = f", {r['batch']:.1f}" if r.get("batch") else ""
                cells.append(f"{r['rps']:.1f} ({r['rps'] / ideal(clients, batch_s):.2f}; {r['rps'] / floor:.2f}), "
                             f"{r['p50']:.0f} / {r['p90']:.0f}{batch}")
                rows.append({"clients": clients, "server": n, "engine": e, **r, "ideal": ideal(clients, batch_s),
                             "floor_rps": floor})
        lines.append("| " + " | ".join(cells) + " |")
    beside = f", {hogs_per_core} CPU hog(s) per core beside" if hogs_per_core else ""
    beside += f", the median of {rounds} alternated rounds" if rounds > 1 else ""
    title = (f"Closed loop at every concurrency, {batch_ms:g} ms a batch of up to 100, linger 20 ms{beside} (of ideal: "
             f"of N / (batch + 2 ms); of the floor: of one batch per cycle on a bare aiohttp server, the same client)")
    name = f"closed_loop_sweep_{batch_ms:g}ms" + (f"_hogs{hogs_per_core}" if hogs_per_core else "") + (
        f"_clients_{'_'.join(map(str, CLIENTS))}" if chosen and not hogs_per_core else "")
    save_table(name, title, rows, lines, args.out_dir or RESULTS)
