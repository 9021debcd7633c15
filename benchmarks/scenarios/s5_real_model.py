"""S5, a real model: all-MiniLM-L6-v2 on this machine's CPU, batched (up to 32) vs max_batch_size = 1.

Both at the same offered load in one run: open-loop Poisson at 60 and 120 req/s (the unbatched
server's capacity is about 86 req/s on 2 cores), and closed loop with 32 clients for the throughput
each can reach. The ratio is the point.
"""

from common import inferd_server, parse_args, save, step

BODY = b'{"model": "minilm", "input": "request {i}: a sentence of ordinary length to embed for the benchmark"}'


def minilm_config(max_batch: int) -> str:
    return f"""
[server]
access_log = "off"

[[models]]
name = "minilm"
backend = "inferd.backends.transformer:create"
max_batch_size = {max_batch}
max_wait_ms = {5 if max_batch > 1 else 0}
max_queue = 4000
timeout_ms = 30000
[models.options]
max_tokens = 128
bucket_edges = [16, 32, 64, 128]
"""


if __name__ == "__main__":
    args = parse_args(__doc__)
    results = {}
    for label, max_batch in (("batched", 32), ("unbatched", 1)):
        steps = []
        with inferd_server(minilm_config(max_batch)) as url:
            for rate in (60, 120):
                steps.append(step(url, rate=rate, duration_s=20, quick=args.quick, body=BODY, warmup_s=3))
            steps.append(step(url, clients=32, duration_s=20, quick=args.quick, body=BODY, engine="python", warmup_s=3))
        for s in steps:
            s["variant"] = label
        results[label] = steps
        save(f"S5_{label}", f"S5: MiniLM on CPU, {label} (max_batch_size={max_batch})", steps, args.out_dir)
    closed = {label: steps[-1] for label, steps in results.items()}
    ratio = closed["batched"]["achieved_rps"] / max(1e-9, closed["unbatched"]["achieved_rps"])
    print(f"\nclosed-loop throughput, batched / unbatched: {ratio:.2f}x")
