"""A batch prepared while the one before it computes (issue 48), on the CPU with a stand-in for the GPU.

The simulated GPU with host-side work per batch (`prepare_ms`, then `latency_ms` on the device, batches of
up to 32) at saturation (256 closed-loop clients, wrk, distinct inputs), the worker calling it in two steps
(`pipelined = true`: the next full batch is launched while one computes) and in one, alternated round by
round. The ceilings: 32 / (prepare + compute) in one step, 32 / max(prepare, compute) pipelined; the goal
is >= 0.90 of the pipelined ceiling.
"""

from __future__ import annotations

import statistics

from common import RESULTS, inferd_server, own_option, parse_args, save_table, sim_config, step

BODY = b'{"input": "pipelined {i}"}'


def main() -> None:
    prepare_ms, compute_ms = float(own_option("--prepare-ms") or 20), float(own_option("--compute-ms") or 25)
    rounds = int(own_option("--rounds") or 3)
    args = parse_args(__doc__ or "")
    rows = []
    for round_ in range(rounds):
        for pipelined in (True, False) if round_ % 2 == 0 else (False, True):
            config = sim_config(latency_ms=compute_ms, max_batch=32, max_wait_ms=5, extra_server='access_log = "off"')
            config += f"prepare_ms = {prepare_ms}\npipelined = {'true' if pipelined else 'false'}\n"  # ([models.options])
            with inferd_server(config) as url:
                result = step(url, clients=256, duration_s=10, quick=args.quick, body=BODY)
            row = {"round": round_ + 1, "pipelined": pipelined, "req_per_s": result["achieved_rps"],
                   "mean_batch": (result.get("server") or {}).get("mean_batch_size"), "p50_ms": result["latency_ms"]["p50"]}
            rows.append(row)
            print(row, flush=True)
    serial, overlapped = 32 / (prepare_ms + compute_ms) * 1000, 32 / max(prepare_ms, compute_ms) * 1000
    medians = {p: statistics.median(r["req_per_s"] for r in rows if r["pipelined"] is p) for p in (True, False)}
    lines = ["| round | worker | req/s | mean batch | p50 ms |", "|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {'pipelined' if r['pipelined'] else 'one step'} | {r['req_per_s']:.0f} | {r['mean_batch']} | "
              f"{r['p50_ms']} |" for r in rows]
    lines.append("")
    lines.append(f"Ceilings: {serial:.0f} req/s in one step (32 / (prepare + compute)), {overlapped:.0f} pipelined "
                 f"(32 / max(prepare, compute)). Medians: pipelined {medians[True]:.0f} req/s "
                 f"(**{medians[True] / overlapped:.3f}** of its ceiling), one step {medians[False]:.0f} "
                 f"({medians[False] / serial:.3f} of its).")
    title = f"A batch prepared while one computes: stand-in, {prepare_ms:.0f} ms host-side + {compute_ms:.0f} ms device per batch of 32"
    save_table("pipelined_standin", title, rows, lines, args.out_dir or RESULTS)


if __name__ == "__main__":
    main()
