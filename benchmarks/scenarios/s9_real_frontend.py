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
"""

from common import inferd_server, median_of, parse_args, save, sim_config, step

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


if __name__ == "__main__":
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
