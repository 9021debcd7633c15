"""The event loop under a flood of 4 MB images: `GET /healthz` p99 (the goal: <= 10 ms), this checkout
against an earlier one, alternated round by round.

S16's flood (its ViT-small-shaped model, random weights, on the CPU): 8 clients send a 1200 x 1200
noise PNG back to back, first as JSON base64 (5.5 MB bodies), then as raw `image/png` bodies (4.1 MB),
while another process probes `/healthz` every 20 ms on a kept-alive connection. `--torch-threads N`
sets the model's `torch_threads` (unset: PyTorch's default, every core: on a 2-core machine the
model's forward then competes with the event loop for both). `--worker-nice N`: no baseline tree, but
this checkout with `[server] worker_nice = N` against `worker_nice = 0` (the models' threads at the
loop's CPU priority), alternated the same way. `--against "server: KEY = VALUE"` or `--against
"options: KEY = VALUE"` (repeatable): this checkout against itself with that line added to `[server]` or
to the model's options, e.g. `keep_freed_memory_mb = 0` or `execute_nice = 0` to weigh one default.
`--collapse`: collapsing on (the default config's; S16 turns it off because it repeats one image) with
16 distinct images sent in turn, so every image is keyed. Besides the probe's figures: the event loop's
CPU per image, and the server process's page faults per image (memory touched afresh).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
from pathlib import Path

from common import RESULTS, inferd_server, listening_pid, main_thread_cpu_s, minor_page_faults
from s16_images import CONFIG, SIZES, body_of, capacity, flood, make_vit, png


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--baseline-tree", help="a checkout of an earlier inferd (git worktree add DIR REF)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=10.0, help="per flood (JSON, then raw)")
    parser.add_argument("--torch-threads", type=int)
    parser.add_argument("--worker-nice", type=int, help="instead of a baseline tree: this checkout with "
                        "`[server] worker_nice` N against 0 (the models' threads as the loop)")
    parser.add_argument("--against", action="append", default=[], help='"server: KEY = VALUE" or "options: KEY = '
                        'VALUE": a variant of this checkout with that line in [server] or the model\'s options (repeatable)')
    parser.add_argument("--collapse", action="store_true", help="collapsing on (the default config's; S16 turns it "
                        "off), with 16 distinct images in turn: what keying each image costs the loop")
    parser.add_argument("--out-dir", default=str(RESULTS))
    parser.add_argument("--name", help="the results files' name (default: from the options, e.g. image_flood_collapse)")
    args = parser.parse_args()
    # variant -> (tree, [server] lines of its own, model option lines of its own)
    trees: dict[str, tuple[str | None, str, str]] = {"this checkout": (None, "", "")}
    if args.worker_nice is not None:
        trees = {f"worker_nice = {n}": (None, f"\nworker_nice = {n}", "") for n in (args.worker_nice, 0)}
    elif args.baseline_tree:
        trees["baseline"] = (args.baseline_tree, "", "")
    for against in args.against:
        table, _, line = against.partition(":")
        if table.strip() not in ("server", "options") or "=" not in line:
            parser.error(f'--against {against!r}: "server: KEY = VALUE" or "options: KEY = VALUE"')
        trees[line.strip()] = (None, "\n" + line.strip(), "") if table.strip() == "server" else (None, "", "\n" + line.strip())
    extra = f"\ntorch_threads = {args.torch_threads}" if args.torch_threads else ""
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        path = make_vit(Path(folder))
        config = CONFIG.replace("max_image_bytes = 8388608", "max_image_bytes = 8388608" + extra).format(
            path=path, sizes=list(SIZES))
        if args.collapse:
            config = config.replace("collapse = false", "collapse = true")
        images = [png(1200, 1200, seed=7 + k) for k in range(16 if args.collapse else 1)]
        for round_ in range(1, args.rounds + 1):
            for name, (tree, server, options) in trees.items():
                variant = config.replace('access_log = "off"', 'access_log = "off"' + server)
                with inferd_server(variant.replace("max_image_bytes = 8388608", "max_image_bytes = 8388608" + options),
                                   **({"tree": tree} if tree else {})) as url:
                    asyncio.run(capacity(url, [body_of(png(96, 96, seed=1))], 2))  # (warm)
                    for how, body, content_type in (("JSON, base64", [body_of(i) for i in images], "application/json"),
                                                    ("raw image/png", images, "image/png")):
                        pid = listening_pid(url)
                        before, faults = main_thread_cpu_s(pid), minor_page_faults(pid)
                        row = asyncio.run(flood(url, body, args.seconds, content_type))
                        row["loop_cpu_ms_per_image"] = round((main_thread_cpu_s(pid) - before) * 1000 / max(1, row["images_sent"]), 2)
                        row["page_faults_per_image"] = round((minor_page_faults(pid) - faults) / max(1, row["images_sent"]))
                        row.update(round=round_, tree=name, sent_as=how)
                        rows.append(row)
                        print(json.dumps(row), flush=True)
    threads = args.torch_threads or "PyTorch's default"
    collapse = ", collapsing on, 16 distinct images" if args.collapse else ""
    lines = [f"### `/healthz` under a flood of 4 MB images (torch_threads: {threads}{collapse})", "",
             "| round | checkout | images sent as | images answered | event loop's CPU ms per image | page faults per image | "
             "healthz probes | healthz p50 ms | healthz p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['round']} | {r['tree']} | {r['sent_as']} | {r['images_sent']} | {r['loop_cpu_ms_per_image']} | "
                     f"{r['page_faults_per_image']} | {r['healthz_probes']} | {r['healthz_p50_ms']} | **{r['healthz_p99_ms']}** |")
    lines += ["", "Medians of the rounds (healthz p99 ms; the event loop's CPU ms per image; the process's page faults per image):", ""]
    for name in trees:
        for how in ("JSON, base64", "raw image/png"):
            mine = [r for r in rows if r["tree"] == name and r["sent_as"] == how]
            lines.append(f"- {name}, {how}: **{statistics.median(r['healthz_p99_ms'] for r in mine):.1f}**; "
                         f"{statistics.median(r['loop_cpu_ms_per_image'] for r in mine):.2f} ms; "
                         f"{statistics.median(r['page_faults_per_image'] for r in mine):.0f}")
    out = Path(args.out_dir)
    stem = args.name or "image_flood" + (f"_threads{args.torch_threads}" if args.torch_threads else "") + \
        (f"_worker_nice{args.worker_nice}" if args.worker_nice is not None else "") + ("_collapse" if args.collapse else "")
    (out / f"{stem}.json").write_text(json.dumps(rows, indent=1) + "\n")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    sys.exit(main())
