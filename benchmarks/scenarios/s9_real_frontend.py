"""S9, the real embedding path's front-end cost, against S2's simulated GPU in the same run.

S9 serves all-MiniLM-L6-v2 through the real backend (its Rust tokenizer on the preprocessing thread,
length buckets, collation into padded arrays, float32 output rows written by orjson) with only the
forward replaced by a stand-in (`gpu_standin`) that sleeps the GPU's time, releasing the GIL as a
CUDA forward waiting on the device does, and returns normalised 384-float rows. S2 serves the seed's
simulated GPU. Both at 10 ms per batch of up to 100, the same short inputs, wrk at 100 and 400
clients, alternated three times; the ratio of the medians is the figure: what a real model's pre- and
post-processing costs the event loop over a model that costs it nothing.

Then S9 once with the stand-in following the H200's direct MiniLM curve (2.9 ms at batch 1 to 6.6 ms
at 256) instead of a flat 10 ms. With --baseline-tree, the unchanged main's S2 and S9 once each.

`--routes`, each route against its floor instead (`route_floor.{md,json}`, ~8 minutes): the server's CPU
per answered request (its whole process, from /proc) at 400 closed-loop clients (wrk, 2 processes), for
`/v1/inference` on the seed's function (S2) and on MiniLM (S9), OpenAI's `/v1/embeddings`, TEI's
`/embed`, Cohere's `/v2/embed` and KServe v2's infer, one input a call, beside a bare aiohttp + uvloop
+ orjson server answering the same bytes on the same paths (`benchmarks/floor/same_bytes.py`), three
rounds alternated (with `--baseline-tree`, that checkout too); the ratio of the medians is the figure.
Then `/v1/embeddings` once with the stand-in
on the H200's MiniLM curve: what one process serves when the GPU is that fast.

`--gil`, the GIL check instead (`gil_interference.{md,json}`): how much longer one forward of the real
MiniLM on the CPU takes while the same process serves S2's load, and how much of that is the GIL rather
than the machine's two cores.

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

import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from statistics import median

from common import (
    REPO,
    free_port,
    inferd_process,
    inferd_server,
    measured_step,
    median_of,
    parse_args,
    save,
    save_table,
    sim_config,
    step,
    wait_answering,
)

S9_BODY = b'{"model": "minilm", "input": "E equals {i}"}'
ROUNDS = 3


def standin_config(gpu: str, max_batch: int = 100) -> str:
    return f"""
[server]

[[models]]
name = "minilm"
backend = "gpu_standin:create"
max_batch_size = {max_batch}
max_wait_ms = 20
max_queue = 4000
[models.options]
{gpu}
max_tokens = 128
bucket_edges = [16, 32, 64, 128]
"""


def run(label: str, config: str, body: bytes, quick: bool, tree=None) -> list[dict]:
    steps = []
    with inferd_server(config, tree=tree) if tree else inferd_server(config) as url:
        for clients in (100, 400):
            result = step(url, clients=clients, duration_s=10, quick=quick, processes=2, body=body)
            result["variant"] = label
            steps.append(result)
    return steps


GIL_MINILM = """
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
GIL_TEXT = "a sentence of ordinary length, to be embedded while the server is busy with other work"


def forward_ms(url: str, count: int) -> list[float]:
    """Compute times (Server-Timing) of `count` minilm requests sent one after another."""
    times = []
    for i in range(count):
        body = json.dumps({"model": "minilm", "input": f"{GIL_TEXT} {i}"}).encode()
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
    config = sim_config(latency_ms=10) + GIL_MINILM
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



def gil_check() -> None:
    """The GIL check (`--gil`): this checkout, and the baseline tree when given."""
    args = parse_args(__doc__, baseline=True)
    rows = [measure("inferd", args.quick)]
    if args.baseline_tree:
        rows.append(measure("unchanged main", args.quick, tree=args.baseline_tree))
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


ROUTES = (  # (label, path, body): one input a call, every body distinct
    ("S2: /v1/inference, the seed's function", "/v1/inference", b'{"input": "E equals {i}"}'),
    ("S9: /v1/inference, MiniLM", "/v1/inference", S9_BODY),
    ("OpenAI /v1/embeddings", "/v1/embeddings", b'{"model": "minilm", "input": "E equals {i}"}'),
    ("TEI /embed", "/embed", b'{"inputs": "E equals {i}"}'),
    ("Cohere /v2/embed", "/v2/embed", b'{"model": "minilm", "texts": ["E equals {i}"]}'),
    ("KServe v2 infer", "/v2/models/minilm/infer",
     b'{"inputs": [{"name": "text", "shape": [1], "datatype": "BYTES", "data": ["E equals {i}"]}]}'),
)


@contextmanager
def floor_process() -> Iterator[tuple[str, int]]:
    """`benchmarks/floor/same_bytes.py` on a free port: (its URL, its pid)."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, str(REPO / "benchmarks" / "floor" / "same_bytes.py"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_answering(url, "the floor server")
        yield url, proc.pid
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


def route_rounds(quick: bool, baseline: str | None, out_dir: str) -> None:
    """`--routes` (see the module docstring); `baseline`: a checkout measured the same way, in each round."""
    config = sim_config(latency_ms=10) + standin_config("gpu_ms = 10").replace("[server]", "")
    servers = ("inferd", "floor") + (("baseline",) if baseline else ())
    found: dict[str, dict[str, list[dict]]] = {label: {s: [] for s in servers} for label, _, _ in ROUTES}
    for _ in range(1 if quick else 3):
        for server in servers:
            started = (inferd_process(config) if server == "inferd" else floor_process() if server == "floor" else
                       inferd_process(config, tree=baseline))  # type: ignore[arg-type]
            with started as (url, pid):
                for label, path, body in ROUTES:
                    result = measured_step(url, pid, clients=400, duration_s=8, quick=quick, path=path, body=body)
                    found[label][server].append({"rps": result["achieved_rps"], "errors": result.get("errors", 0),
                                                 "cpu_us": result["server"]["cpu_us_per_request"]})
                    print(server, label, found[label][server][-1], file=sys.stderr, flush=True)
    with inferd_process(standin_config("", max_batch=256)) as (url, pid):
        h200 = measured_step(url, pid, clients=400, duration_s=8, quick=quick, path="/v1/embeddings", body=ROUTES[2][2])
    head = "| route | inferd: server CPU µs/request (median) | the floor's | ÷ the floor | inferd req/s | the floor's req/s |"
    lines = [head + (" baseline: CPU µs/request (÷ the floor), req/s |" if baseline else ""),
             "|---|---|---|---|---|---|" + ("---|" if baseline else "")]
    rows = []
    for label, path, _ in ROUTES:
        cpu = {s: median(r["cpu_us"] for r in found[label][s]) for s in servers}
        rps = {s: median(r["rps"] for r in found[label][s]) for s in servers}
        mine, floor = cpu["inferd"], cpu["floor"]
        line = f"| {label} | {mine:.1f} | {floor:.1f} | {mine / floor:.2f} | {rps['inferd']:,.0f} | {rps['floor']:,.0f} |"
        if baseline:
            line += f" {cpu['baseline']:.1f} ({cpu['baseline'] / floor:.2f}), {rps['baseline']:,.0f} |"
        lines.append(line)
        rows.append({"route": label, "path": path, "cpu_us": cpu, "rps": rps, "ratio": mine / floor,
                     "rounds": found[label]})
    lines += ["", f"`/v1/embeddings` with the stand-in on the H200's MiniLM curve (batches of up to 256), one process on "
              f"this host: {h200['achieved_rps']:,.0f} req/s at {h200['server']['cpu_us_per_request']} µs of server CPU "
              f"a request (p50 {h200['latency_ms']['p50']:.1f} ms)."]
    rows.append({"route": "OpenAI /v1/embeddings, H200 curve", "inferd_rps": h200["achieved_rps"],
                 "inferd_cpu_us": h200["server"]["cpu_us_per_request"], "p50_ms": h200["latency_ms"]["p50"]})
    save_table("route_floor", "Each route against its floor: server CPU per request at 400 closed-loop clients (wrk), "
               "10 ms a batch of up to 100 (the GPU a stand-in), one input a call, 3 rounds alternated", rows, lines,
               out_dir)


if __name__ == "__main__":
    if "--routes" in sys.argv:
        sys.argv.remove("--routes")
        route_args = parse_args(__doc__, baseline=True)
        route_rounds(route_args.quick, route_args.baseline_tree, route_args.out_dir)
        sys.exit(0)
    if "--gil" in sys.argv:
        sys.argv.remove("--gil")
        gil_check()
        sys.exit(0)
    args = parse_args(__doc__, baseline=True)
    steps: list[dict] = []
    for _ in range(1 if args.quick else ROUNDS):
        steps += run("S2", sim_config(latency_ms=10), b'{"input": "E equals {i}"}', args.quick)
        steps += run("S9", standin_config("gpu_ms = 10"), S9_BODY, args.quick)
    summary = {}
    for clients in (100, 400):
        s2 = [s for s in steps if s["variant"] == "S2" and s["offered"] == clients]
        s9 = [s for s in steps if s["variant"] == "S9" and s["offered"] == clients]
        summary[f"{clients}_clients"] = {
            "s2_rps": median_of(s2, "achieved_rps"), "s9_rps": median_of(s9, "achieved_rps"),
            "s9_over_s2": round(median_of(s9, "achieved_rps") / median_of(s2, "achieved_rps"), 3),
            "s2_cpu_us": median_of(s2, "cpu_us_per_request"), "s9_cpu_us": median_of(s9, "cpu_us_per_request"),
        }
    steps += run("S9, H200 MiniLM curve", standin_config("", max_batch=256), S9_BODY, args.quick)
    if args.baseline_tree:
        steps += run("S2, unchanged main", sim_config(latency_ms=10), b'{"input": "E equals {i}"}', args.quick,
                     tree=args.baseline_tree)
        steps += run("S9, unchanged main", standin_config("gpu_ms = 10"), S9_BODY, args.quick, tree=args.baseline_tree)
    steps[-1]["summary"] = summary
    save("S9", "S9: the real MiniLM front end (GPU stand-in, 10 ms/batch) beside S2, alternated", steps, args.out_dir,
         ceiling_rps=10000, plots=False)
    print(summary)
