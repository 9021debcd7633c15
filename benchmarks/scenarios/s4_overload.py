"""S4, overload: S1 offered at 3x its ceiling (3,000 req/s, Poisson) for 60 s.

Achieved throughput, p99 of the admitted requests, the share answered 503, and the server's RSS sampled
every few seconds (it must stay flat). Nothing may hang or go unanswered: sent == answered.
"""

import threading
import time

from common import inferd_server, parse_args, save, sim_config, step

from inferd.bench.runner import fetch_stats

if __name__ == "__main__":
    args = parse_args(__doc__)
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
        result = step(url, rate=3000, duration_s=60, quick=args.quick, processes=2, warmup_s=0)
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
    save("S4", "S4: overload, S1 at 3x its ceiling (3,000 req/s offered)", [result], args.out_dir,
         ceiling_rps=1000, floor_ms=100)
    print(result["overload"])
