"""GIL interference on the CPU: how much longer one forward of the real MiniLM takes while the same
process serves S2's load, and how much of that is the GIL rather than the machine's two cores.

One server process serves `batchstring` (S2's simulated GPU, 10 ms per batch of up to 100) and
`minilm` (the real model on the CPU, one torch thread, batches of one). A client sends minilm requests
one at a time and reads each batch's compute time from Server-Timing:
- alone: nothing else runs;
- same process: wrk loads `batchstring` at 400 clients in the same server process (loop, GIL);
- other process: the same wrk load against a second server process (the cores are as busy, the GIL
  is not shared).
`same / alone` is the slowdown the issue asks about; `same / other` is the part due to sharing the
process (the GIL), since the cores are equally loaded in both. With --baseline-tree, the unchanged
main is measured the same way in the same run.
"""

from __future__ import annotations

import json
import threading
import time
import urllib.request
from statistics import median

from common import inferd_server, parse_args, sim_config, step

MINILM = """
[[models]]
name = "minilm"
backend = "inferd.backends.transformer:create"
max_batch_size = 1
max_wait_ms = 0
[models.options]
torch_threads = 1
max_tokens = 64
bucket_edges = [16, 32, 64]
"""
TEXT = "a sentence of ordinary length, to be embedded while the server is busy with other work"


def forward_ms(url: str, count: int) -> list[float]:
    """Compute times (Server-Timing) of `count` minilm requests sent one after another."""
    times = []
    for i in range(count):
        body = json.dumps({"model": "minilm", "input": f"{TEXT} {i}"}).encode()
        request = urllib.request.Request(f"{url}/v1/inference", data=body, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=30) as resp:
            timing = dict(p.strip().split(";dur=") for p in resp.headers["Server-Timing"].split(","))
        times.append(float(timing["compute"]))
    return times


def under_load(load_url: str, probe_url: str, count: int, quick: bool) -> tuple[list[float], dict]:
    """Probe while wrk loads `load_url` at 400 clients."""
    result: dict = {}
    load = threading.Thread(target=lambda: result.update(
        step(load_url, clients=400, duration_s=12, warmup_s=0, quick=quick, processes=2)))
    load.start()
    time.sleep(1.0)  # the load is on
    times = forward_ms(probe_url, count)
    load.join()
    return times, result


def measure(label: str, quick: bool, tree=None) -> dict:
    count = 15 if quick else 40
    config = sim_config(latency_ms=10) + MINILM
    kw = {"tree": tree} if tree else {}
    with inferd_server(config, **kw) as url:
        forward_ms(url, 5)  # warm
        alone = forward_ms(url, count)
        same, same_load = under_load(url, url, count, quick)
        with inferd_server(sim_config(latency_ms=10), **kw) as other_url:
            other, other_load = under_load(other_url, url, count, quick)
    row = {
        "variant": label,
        "forward_ms_alone": round(median(alone), 2),
        "forward_ms_same_process_load": round(median(same), 2),
        "forward_ms_other_process_load": round(median(other), 2),
        "load_rps_same": same_load.get("achieved_rps"),
        "load_rps_other": other_load.get("achieved_rps"),
    }
    row["slowdown_same_over_alone"] = round(row["forward_ms_same_process_load"] / row["forward_ms_alone"], 2)
    row["slowdown_same_over_other"] = round(row["forward_ms_same_process_load"] / row["forward_ms_other_process_load"], 2)
    print(row)
    return row


if __name__ == "__main__":
    args = parse_args(__doc__, baseline=True)
    rows = [measure("inferd", args.quick)]
    if args.baseline_tree:
        rows.append(measure("unchanged main", args.quick, tree=args.baseline_tree))
    from pathlib import Path

    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gil_interference.json").write_text(json.dumps({"rows": rows, "note": __doc__}, indent=2) + "\n")
    header = ("| variant | forward alone (ms) | same process under S2 load | other process under S2 load | "
              "same / alone | same / other | S2 req/s beside it |")
    lines = [header, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['variant']} | {r['forward_ms_alone']} | {r['forward_ms_same_process_load']} | "
                     f"{r['forward_ms_other_process_load']} | {r['slowdown_same_over_alone']} | "
                     f"{r['slowdown_same_over_other']} | {r['load_rps_same']} |")
    (out / "gil_interference.md").write_text("### GIL interference: one MiniLM forward on the CPU (median)\n\n"
                                             + "\n".join(lines) + "\n")
    print("\n".join(lines))
