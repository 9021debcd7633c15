"""Compact vectors on the wire: MiniLM's embeddings (the real tokenizer and output rows, the forward a
stand-in sleeping 3 ms a batch, `gpu_standin`) as float, base64, int8 and binary, and cut to 128
dimensions, float and int8. Each a `/v1/embeddings` call of 32 distinct texts from wrk's 32 clients;
per variant: the answer's bytes, calls/s, and the event loop's CPU (the server's main thread, from
/proc) per call, beside float's in the same run. Rounds alternate the variants (this machine is noisy);
the figures are medians.
"""

from __future__ import annotations

import json
import statistics
import urllib.request
from pathlib import Path

from common import RESULTS, inferd_process, main_thread_cpu_s, parse_args, step

CONFIG = """
[server]
access_log = "off"

[[models]]
name = "minilm"
backend = "gpu_standin:create"
max_batch_size = 128
max_wait_ms = 5
max_queue = 20000
[models.options]
gpu_ms = 3
max_tokens = 64
bucket_edges = [16, 32, 64]
"""
TEXTS = 32
VARIANTS = {"float": {}, "base64": {"encoding_format": "base64"}, "int8": {"encoding_format": "int8"},
            "binary": {"encoding_format": "binary"}, "float, 128 dims": {"dimensions": 128},
            "int8, 128 dims": {"dimensions": 128, "encoding_format": "int8"}}


def body(fields: dict) -> bytes:
    texts = [f"text {k} of call {{i}}: a sentence to embed" for k in range(TEXTS)]
    return json.dumps({"model": "minilm", "input": texts, **fields}).encode()


def answer_bytes(url: str, fields: dict) -> int:
    request = urllib.request.Request(f"{url}/v1/embeddings", data=body(fields).replace(b"{i}", b"probe"),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as resp:
        return len(resp.read())


def main() -> None:
    args = parse_args(__doc__ or "")
    seconds = 3.0 if args.quick else 8.0
    rows: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with inferd_process(CONFIG) as (url, pid):
        sizes = {name: answer_bytes(url, fields) for name, fields in VARIANTS.items()}
        step(url, clients=32, duration_s=2.0, quick=args.quick, path="/v1/embeddings", body=body({}), stats_path=None,
             warmup_s=0)  # (the shapes' first calls, the cost model's first figures)
        for round_ in range(1 if args.quick else 3):
            order = list(VARIANTS) if round_ % 2 == 0 else list(VARIANTS)[::-1]
            for name in order:
                before = main_thread_cpu_s(pid)
                result = step(url, clients=32, duration_s=seconds, quick=args.quick, path="/v1/embeddings",
                              body=body(VARIANTS[name]), stats_path=None, warmup_s=0)
                loop_s = main_thread_cpu_s(pid) - before
                rows[name].append({"calls_per_s": result["achieved_rps"],
                                   "loop_us_per_call": loop_s / max(1, result["completed"]) * 1e6, "errors": result["errors"]})
    base = statistics.median(r["loop_us_per_call"] for r in rows["float"])
    lines = ["| variant | answer bytes (32 vectors) | of float's | calls/s | loop CPU per call, µs | of float's |",
             "|---|---|---|---|---|---|"]
    summary = {}
    for name, runs in rows.items():
        cpu = statistics.median(r["loop_us_per_call"] for r in runs)
        rate = statistics.median(r["calls_per_s"] for r in runs)
        summary[name] = {"answer_bytes": sizes[name], "calls_per_s": rate, "loop_us_per_call": round(cpu, 1), "runs": runs}
        lines.append(f"| {name} | {sizes[name]:,} | {sizes[name] / sizes['float']:.3f} | {rate:,.0f} | {cpu:,.0f} | "
                     f"{cpu / base:.2f} |")
    text = "### Vector types: MiniLM's vectors on /v1/embeddings, 32 texts a call\n\n" + "\n".join(lines) + "\n"
    print(text)
    if not args.quick:
        out = Path(args.out_dir or RESULTS)
        (out / "vector_types.json").write_text(json.dumps({"summary": summary, "note": __doc__}, indent=1) + "\n")
        (out / "vector_types.md").write_text(text)


if __name__ == "__main__":
    main()
