"""Where S17's time goes in each server's front process: py-spy on inferd's process and on `vllm serve`'s
API server process (not the engine core: a process of its own in both) while `vllm bench serve`
drives one S17 cell, one server after the other. Reports each front's main thread busy share (samples
not waiting in the event loop's select) and its busiest stacks.

Why: S17's TPOT cells move by up to 30% between rounds on this 2-core machine; if the front's
event loop were what sets the pace, its main thread would be busy, and per-delta work there the thing
to cut.

`python s17_front_profile.py [--kind plain] [--clients 16] [--seconds 24]` (~3 minutes).
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import tempfile
import time
from pathlib import Path

import s17_vllm_serve as s17
from common import RESULTS, inferd_server

from inferd.backends.tiny_llama import build_tiny_llama

PY_SPY = Path(__file__).resolve().parents[2] / ".venv" / "bin" / "py-spy"
IDLE = ("Runner.run", "_PollLikeSelector.select", "Condition.wait", "_worker")


def profile(url: str, model: str, which: str, kind: str, clients: int, seconds: float, out: Path) -> dict:
    s17.bench(url, model, kind, clients, True)  # (warm)
    pattern = "inferd serve" if which == "inferd" else "vllm.entrypoints.openai.api_server"
    pid = int(subprocess.check_output(["pgrep", "-n", "-f", pattern]).split()[0])
    samples = out / f"{which}.txt"
    spy = subprocess.Popen([str(PY_SPY), "record", "--pid", str(pid), "--threads", "--idle", "--nonblocking", "--format",
                            "raw", "-r", "200", "-d", str(int(seconds) + 1), "-o", str(samples)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started, runs = time.monotonic(), []
    while time.monotonic() - started < seconds:
        runs.append(s17.bench(url, model, kind, clients, False))
    spy.wait()
    total = busy = 0
    stacks: collections.Counter[str] = collections.Counter()
    for line in samples.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if "MainThread" not in frames[0]:
            continue
        n = int(count)
        total += n
        leaf = frames[-1].split(" (")[0]
        if leaf in IDLE:
            continue
        busy += n
        stacks[" <- ".join(f.split(" (")[0] for f in frames[-1:-4:-1])] += n
    return {"runs": runs, "main_thread_samples": total, "main_thread_busy": round(busy / total, 4) if total else None,
            "top": stacks.most_common(8)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--kind", default="plain", choices=list(s17.KINDS))
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=24.0)
    parser.add_argument("--without-stats", action="store_true", help="also `vllm serve --disable-log-stats`")
    parser.add_argument("--out-dir", default=str(RESULTS))
    args = parser.parse_args()
    model = str(build_tiny_llama(Path(tempfile.mkdtemp(prefix="s17-model-")) / "tiny-llama"))
    work = Path(tempfile.mkdtemp(prefix="s17-profile-"))
    found = {}
    with inferd_server(s17.inferd_config(model)) as url:
        found["inferd"] = profile(url, model, "inferd", args.kind, args.clients, args.seconds, work)
    with s17.VllmServe(model) as url:
        found["vllm serve"] = profile(url, model, "vllm", args.kind, args.clients, args.seconds, work)
    if args.without_stats:
        with s17.VllmServe(model, log_stats=False) as url:
            found["vllm serve --disable-log-stats"] = profile(url, model, "vllm", args.kind, args.clients, args.seconds, work)
    lines = [f"### S17's fronts under `{args.kind}` at {args.clients} clients: py-spy on each server's front process", "",
             "| server | runs: output tok/s | TPOT p50 ms | main thread busy | busiest stacks (samples) |", "|---|---|---|---|---|"]
    for name, f in found.items():
        tops = "; ".join(f"{stack} ({n})" for stack, n in f["top"][:4])
        lines.append(f"| {name} | {', '.join(str(r['output_tokens_per_s']) for r in f['runs'])} | "
                     f"{', '.join(str(r['tpot_p50_ms']) for r in f['runs'])} | {f['main_thread_busy']:.1%} | {tops} |")
    out = Path(args.out_dir)
    stem = f"S17_front_profile_{args.kind}_{args.clients}"
    (out / f"{stem}.json").write_text(json.dumps(found, indent=1) + "\n")
    (out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
