"""Images at a GPU host's pace: what the host spends per image when the GPU is not the limit.

The second H200 run served a ViT-small at 335 images/s, batched or not, its GPU 4% busy: the host's
preparation of each image was the ceiling. Here the real image backend (decoding, checks, resizing,
the batch stacked and handed to the forward) serves with only the forward stood in (`gpu_standin.
create_image`: a fixed sleep per batch, `--gpu-ms`), on the CPU: distinct 224 px noise PNGs (the
H200 run's images) as JSON base64 on `/v1/inference`, closed loop, `--clients` at once. Figures per
variant: images/s, the server's CPU per image (its whole process, from /proc) and its event loop's. Variants, alternated
round by round: this checkout with `prepare_threads` 1 and 2 (and more with `--threads`), and with
`--baseline-tree` an earlier checkout (its own preparation, one thread).

Usage: python benchmarks/scenarios/image_standin.py [--baseline-tree DIR] [--rounds 2] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import RESULTS, inferd_server, listening_pid, main_thread_cpu_s, process_tree_cpu_s
from s16_images import body_of, closed_loop, make_vit, png

CONFIG = """
[server]
access_log = "off"
max_body_bytes = 16777216

[[models]]
name = "vit"
backend = "gpu_standin:create_image"
max_batch_size = 64
max_wait_ms = 2
max_queue = 4000
timeout_ms = 60000
collapse = false
[models.options]
model_path = "{path}"
image_sizes = [224]
gpu_ms = {gpu_ms}
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--baseline-tree", help="a checkout of an earlier inferd (git worktree add DIR REF)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--gpu-ms", type=float, default=3.0, help="the stand-in's time per batch (default 3)")
    parser.add_argument("--threads", default="1,2", help="this checkout's prepare_threads to try (default 1,2)")
    parser.add_argument("--out-dir", default=str(RESULTS))
    args = parser.parse_args()
    variants: dict[str, tuple[str | None, str]] = {
        f"this checkout, prepare_threads = {n}": (None, f"\nprepare_threads = {n}") for n in map(int, args.threads.split(","))}
    if args.baseline_tree:
        variants["baseline"] = (args.baseline_tree, "")
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = make_vit(Path(folder))
        bodies = [body_of(png(224, 224, seed=k)) for k in range(32)]
        config = CONFIG.format(path=path, gpu_ms=args.gpu_ms)
        for round_ in range(1, args.rounds + 1):
            for name, (tree, options) in variants.items():
                with inferd_server(config + options, **({"tree": tree} if tree else {})) as url:
                    pid = listening_pid(url)
                    asyncio.run(closed_loop(url, bodies, 2, args.clients))  # (warm)
                    before, loop_before = process_tree_cpu_s(pid), main_thread_cpu_s(pid)
                    result = asyncio.run(closed_loop(url, bodies, args.seconds, args.clients))
                    cpu, loop_cpu = process_tree_cpu_s(pid) - before, main_thread_cpu_s(pid) - loop_before
                row = {"round": round_, "variant": name, "images_per_s": round(result["answered"] / args.seconds, 1),
                       "errors": result["errors"],
                       "server_cpu_ms_per_image": round(cpu * 1000 / max(1, result["answered"]), 3),
                       "loop_cpu_ms_per_image": round(loop_cpu * 1000 / max(1, result["answered"]), 3)}
                rows.append(row)
                print(json.dumps(row), flush=True)
    lines = [f"### Images with the GPU stood in ({args.gpu_ms} ms a batch): 224 px PNGs as JSON, {args.clients} "
             "closed-loop clients, on this machine's CPU", "",
             "| round | variant | images/s | errors | server CPU ms per image | event loop's CPU ms per image |",
             "|---|---|---|---|---|---|"]
    lines += [f"| {r['round']} | {r['variant']} | {r['images_per_s']} | {r['errors']} | {r['server_cpu_ms_per_image']} | "
              f"{r['loop_cpu_ms_per_image']} |" for r in rows]
    lines += ["", "Medians of the rounds:", ""]
    for name in variants:
        mine = [r for r in rows if r["variant"] == name]
        lines.append(f"- {name}: **{statistics.median(r['images_per_s'] for r in mine):.1f} images/s**, "
                     f"{statistics.median(r['server_cpu_ms_per_image'] for r in mine):.2f} ms of server CPU per image, "
                     f"{statistics.median(r['loop_cpu_ms_per_image'] for r in mine):.3f} of the event loop's")
    out = Path(args.out_dir)
    (out / "image_standin.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / "image_standin.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
