"""The seed's workload on the simulated GPU (100 ms per batch, batches up to 100, linger 20 ms), three ways:

- S1: one GPU. Ceiling 1,000 req/s, floor 100 ms. Closed loop (wrk) at 1, 100 and 400 clients, then an
  open-loop Poisson sweep drawn beside the ideal server's curve.
- S3: a GPU host, eight simulated GPUs in one process. Ceiling 8,000 req/s. Closed loop at 800 and 1,600
  clients: 800 fill the eight batches exactly, 1,600 keep a full batch waiting for every GPU.
- S4: overload, S1 offered at 3x its ceiling (3,000 req/s, Poisson) for 60 s: achieved throughput, p99 of
  the admitted requests, the share answered 503, and the server's RSS every few seconds (it must stay
  flat). Nothing may hang or go unanswered: sent == answered.

`--scenario S1` (repeatable) runs one; the default, all three. Results: S1, S3 and S4 in the results folder.
"""

import threading
import time

from common import ideal_curve, inferd_server, parse_args, save, sim_config, step

from inferd.bench.runner import fetch_stats

OPEN_RATES = [50, 200, 500, 800, 900, 950, 980]


def s1(quick: bool, out_dir: str) -> None:
    steps = []
    with inferd_server(sim_config(latency_ms=100)) as url:
        for clients in (1, 100, 400):
            steps.append(step(url, clients=clients, duration_s=10, quick=quick))
        for rate in OPEN_RATES:
            steps.append(step(url, rate=rate, duration_s=10, quick=quick))
    save("S1", "S1: seed workload, 1 simulated GPU, 100 ms/batch, max batch 100", steps, out_dir,
         ceiling_rps=1000, floor_ms=100, ideal=ideal_curve(OPEN_RATES, 0.1, 100, 0.02))


def s3(quick: bool, out_dir: str) -> None:
    steps = []
    with inferd_server(sim_config(latency_ms=100, workers=8, max_queue=8000)) as url:
        for clients in (800, 1600):
            steps.append(step(url, clients=clients, duration_s=10, quick=quick, processes=2))
    save("S3", "S3: GPU host, 8 simulated GPUs, 100 ms/batch, max batch 100", steps, out_dir,
         ceiling_rps=8000, floor_ms=100)


def s4(quick: bool, out_dir: str) -> None:
    with inferd_server(sim_config(latency_ms=100, max_queue=1000)) as url:
        rss: list[tuple[float, int]] = []
        stop = threading.Event()

        def sample() -> None:
            began = time.monotonic()
            while not stop.wait(5):
                stats = fetch_stats(f"{url}/v1/stats")
                if stats:
                    rss.append((round(time.monotonic() - began, 1), stats["process"]["rss_bytes"]))

        sampler = threading.Thread(target=sample, daemon=True)
        sampler.start()
        result = step(url, rate=3000, duration_s=60, quick=quick, processes=2, warmup_s=0)
        stop.set()
        sampler.join()
    answered = sum(v for k, v in result["statuses"].items() if k.isdigit())
    result["overload"] = {
        "answered": answered,
        "unanswered": result["sent"] - answered,
        "share_503": round(result["statuses"].get("503", 0) / max(1, result["sent"]), 4),
        "ok_rps": result["ok_rps"],
        "rss_samples_bytes": rss,
    }
    save("S4", "S4: overload, S1 at 3x its ceiling (3,000 req/s offered)", [result], out_dir,
         ceiling_rps=1000, floor_ms=100)
    print(result["overload"])


if __name__ == "__main__":
    args = parse_args(__doc__, scenarios=("S1", "S3", "S4"))
    for name in args.scenario:
        {"S1": s1, "S3": s3, "S4": s4}[name](args.quick, args.out_dir)
