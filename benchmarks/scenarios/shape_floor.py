"""The shape's floor: inferd beside the same shape with nothing of inferd in it, and beside Mosec 0.9.8.

`benchmarks/floor/bare_shape.py` is the product's shape and nothing else (uvloop, aiohttp's C parser,
orjson, a future per request, one executor thread, a batch handed back in one call): no admission,
routing, ids, deadlines, metrics, logs, timing headers, collapsing or cost model. What it costs per
request no server of this shape can go below, whatever it leaves out; what inferd costs above it is
inferd's own work. inferd is measured twice: as configured by default, and with what a setting turns off
turned off (`LEAN`: metrics, the access log, collapsing), for how much of the way its optional
per-request work is. Measured, alternated round by round, at 100 closed-loop clients (S2's 10 ms batches
of up to 100, wrk in 2 processes with a distinct body per request, beside the servers on this
machine's cores), with each server thread's CPU per request from /proc (`closed_loop_cycle.measured`);
and, with `--callgrind N`, instructions per request under callgrind for N requests at batches of 10
(`callgrind_request.count_server`: every batch full under valgrind's slowness).

    python shape_floor.py [--rounds N] [--callgrind N] [--quick] [--out-dir DIR]

Writes shape_floor.json / .md.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from callgrind_request import MEAN_BATCH, count, count_server
from closed_loop_cycle import CLIENTS, measured, table
from common import (
    REPO,
    _machine,
    free_port,
    inferd_server,
    listening_pid,
    mosec_server,
    own_option,
    parse_args,
    sim_config,
)

FLOOR = REPO / "benchmarks" / "floor" / "bare_shape.py"


def _floor_command(port: int, max_batch: int) -> list[str]:
    return [sys.executable, str(FLOOR), "--port", str(port), "--batch-ms", "10", "--max-batch", str(max_batch)]


def _floor_batches(url: str) -> int:
    with urllib.request.urlopen(f"{url}/stats", timeout=60) as resp:
        return json.loads(resp.read())["batches"]


@contextmanager
def floor_server() -> Iterator[tuple[str, int]]:
    """The bare shape on a free loopback port: (base URL, pid)."""
    port = free_port()
    proc = subprocess.Popen(_floor_command(port, 100), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        give_up = time.monotonic() + 30
        while True:
            try:
                _floor_batches(url)
                break
            except OSError:
                if time.monotonic() > give_up or proc.poll() is not None:
                    raise RuntimeError("the bare shape never answered") from None
                time.sleep(0.1)
        yield url, proc.pid
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def instructions(requests: int) -> dict[str, dict[str, float]]:
    """Instructions per request at batches of 10: inferd (this checkout) and the bare shape."""
    port = free_port()
    floor = count_server(_floor_command(port, 10), REPO, dict(os.environ), f"http://127.0.0.1:{port}", "/stats",
                         _floor_batches, requests)
    floor_batch = MEAN_BATCH[-1]
    inferd = count(REPO, requests, max_batch=10)
    return {"inferd": {"instructions": round(inferd), "per_batch": MEAN_BATCH[-1]},
            "bare shape": {"instructions": round(floor), "per_batch": floor_batch}}


LEAN_SERVER = 'metrics = false\naccess_log = "off"'  # (with collapse = false on the model)


if __name__ == "__main__":
    n_rounds = int(own_option("--rounds") or 3)
    callgrind = int(own_option("--callgrind") or 0)
    args = parse_args(__doc__)
    rounds: list[dict[str, dict[str, Any]]] = []
    with mosec_server(args.quick) as mosec:
        for _ in range(1 if args.quick else n_rounds):
            this: dict[str, dict[str, Any]] = {}
            with inferd_server(sim_config(latency_ms=10.0)) as url:
                this["inferd S2"] = measured(url, listening_pid(url), "/v1/inference", 10.0, args.quick)
            with inferd_server(sim_config(latency_ms=10.0, extra_server=LEAN_SERVER, extra_model="collapse = false")) as url:
                this["inferd S2, metrics, log, collapsing off"] = measured(url, listening_pid(url), "/v1/inference", 10.0,
                                                                           args.quick)
            with floor_server() as (url, pid):
                this["bare shape S2"] = measured(url, pid, "/v1/inference", 10.0, args.quick)
            if mosec is not None:
                this["Mosec 0.9.8 S2"] = measured(mosec[0], mosec[1], "/inference", 10.0, args.quick)
            rounds.append(this)
            print({k: (v["rps"], v["cpu_us"]) for k, v in this.items()}, flush=True)
    ratios = {name: [round(r[name]["rps"] / r["inferd S2"]["rps"], 3) for r in rounds] for name in rounds[0]}
    lines = [f"### The shape's floor at {CLIENTS} closed-loop clients (medians of {len(rounds)} alternated rounds; "
             f"{_machine()})", "", *table(rounds), "",
             "| server | req/s ÷ inferd's, each round | median |", "|---|---|---|"]
    lines += [f"| {name} | {' / '.join(f'{x:.3f}' for x in xs)} | {statistics.median(xs):.3f} |"
              for name, xs in ratios.items()]
    counted = instructions(callgrind) if callgrind else None
    if counted:
        lines += ["", f"Instructions per request (callgrind, {callgrind} requests, 100 clients, batches of up to 10):", "",
                  "| server | instructions | requests per batch |", "|---|---|---|"]
        lines += [f"| {name} | {c['instructions']:,} | {c['per_batch']:g} |" for name, c in counted.items()]
    out = Path(args.out_dir)
    (out / "shape_floor.json").write_text(json.dumps({"clients": CLIENTS, "rounds": rounds, "ratios": ratios,
                                                      "instructions": counted, "note": __doc__}, indent=1) + "\n")
    (out / "shape_floor.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
