"""S17, generation against `vllm serve`: vLLM's own benchmark client (`vllm bench serve`) against inferd and
against vLLM's OpenAI server, the same tiny random-weight Llama and the same engine settings, alternated.

Four request kinds (each a `vllm bench serve` run per concurrency):
- `plain`: /v1/completions, random 64-token prompts, 64 output tokens (`ignore_eos`);
- `json_schema`: /v1/chat/completions with a JSON-schema `response_format` (up to 64 tokens; the
  grammar decides where the output ends);
- `tool_named`, `tool_required` and `tool_auto`: /v1/chat/completions with two tools and `tool_choice` a
  named function, "required" or "auto" (both servers with the hermes tool parser, which vLLM's server
  asks for "required" and "auto"; with "auto" each streamed step goes through the parser).
Output-token throughput, TTFT p50/p99 and TPOT p50 as vLLM's client reports them; inferd / vLLM per cell,
medians over rounds. Goals (issue 26): throughput >= 1.0x, TTFT p99 <= 1.05x, TPOT p50 <= 1.05x.
Both servers are up together; each cell runs on one, then at once on the other (who goes first
alternates), 8 requests a client (32 at least), 3 rounds, the client in one process throughout.
Both servers start their engine with compact JSON for structured outputs (xgrammar, no free
whitespace), else a random model pads a schema's output with whitespace up to the token limit.
"""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import free_port, inferd_server, parse_args

from inferd.backends.tiny_llama import build_tiny_llama

ENGINE = {"dtype": "float32", "max_model_len": 512, "kv_cache_memory_bytes": 64 << 20, "max_num_seqs": 64}
STRUCTURED = {"backend": "xgrammar", "disable_any_whitespace": True}
SCHEMA = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no", "maybe"]},
                                           "score": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["answer", "score"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "enum": ["Oslo", "Lima"]}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "string", "enum": ["UTC", "CET"]}}, "required": ["zone"]}}}]
KINDS = {
    "plain": ("openai", "/v1/completions", None, True),
    "json_schema": ("openai-chat", "/v1/chat/completions",
                    {"response_format": {"type": "json_schema", "json_schema": {"name": "a", "schema": SCHEMA}}}, False),
    "tool_named": ("openai-chat", "/v1/chat/completions",
                   {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "get_time"}}}, False),
    "tool_required": ("openai-chat", "/v1/chat/completions", {"tools": TOOLS, "tool_choice": "required"}, False),
    "tool_auto": ("openai-chat", "/v1/chat/completions", {"tools": TOOLS, "tool_choice": "auto"}, False),
}


class VllmServe:
    """`vllm serve` (its OpenAI server) on loopback with the same engine settings as inferd's: with
    `log_stats` (vLLM's default, and inferd's: its admission reads the engine's scheduler figures),
    the engine reports its figures each step; without, it skips that work."""

    def __init__(self, model: str, log_stats: bool = True) -> None:
        self.model = model
        self.log_stats = log_stats

    def __enter__(self) -> str:
        port = free_port()
        log = tempfile.NamedTemporaryFile("w", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model, "--served-model-name", "tiny",
             "--host", "127.0.0.1", "--port", str(port), "--dtype", ENGINE["dtype"], "--max-model-len", str(ENGINE["max_model_len"]),
             "--kv-cache-memory-bytes", str(ENGINE["kv_cache_memory_bytes"]), "--max-num-seqs", str(ENGINE["max_num_seqs"]),
             "--scheduling-policy", "priority", "--enforce-eager", "--structured-outputs-config", json.dumps(STRUCTURED),
             "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *(() if self.log_stats else ("--disable-log-stats",))],
            stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "VLLM_NO_USAGE_STATS": "1", "HF_HUB_OFFLINE": "1"})
        url = f"http://127.0.0.1:{port}"
        give_up = time.monotonic() + 400
        while time.monotonic() < give_up:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm serve exited: see {log.name}")
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return url
            except OSError:
                time.sleep(1)
        raise TimeoutError("vllm serve never became ready")

    def __exit__(self, *exc: object) -> None:
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def inferd_config(model: str) -> str:
    engine = "\n".join(f"{k} = {json.dumps(v)}" for k, v in ENGINE.items())
    return f"""
[server]
access_log = "off"

[[models]]
name = "tiny"
kind = "generation"
backend = "inferd.backends.vllm"
max_waiting_requests = 1024
timeout_ms = 120000
max_timeout_ms = 120000
[models.options]
model_path = "{model}"
tool_call_parser = "hermes"
{engine}
engine_args = {{structured_outputs_config = {{backend = "xgrammar", disable_any_whitespace = true}}}}
"""


def cell_args(url: str, model: str, kind: str, clients: int, prompts: int) -> list[str]:
    """`vllm bench serve`'s arguments for one cell."""
    backend, endpoint, extra, ignore_eos = KINDS[kind]
    command = ["--backend", backend, "--base-url", url, "--endpoint", endpoint, "--model", "tiny", "--tokenizer", model,
               "--dataset-name", "random", "--random-input-len", "64", "--random-output-len", "64",
               "--num-prompts", str(prompts), "--max-concurrency", str(clients), "--seed", "0", "--disable-tqdm"]
    if ignore_eos:
        command.append("--ignore-eos")
    if extra is not None:
        command += ["--extra-body", json.dumps(extra)]
    return command


def drive(plan_path: str) -> None:
    """The client's side, in one process (vLLM's benchmark module imported once, not per cell): each
    cell of the plan through `vllm bench serve`'s own `main`, one JSON line per cell on stdout's last
    lines (prefixed, as vLLM's client prints its own report too)."""
    from vllm.benchmarks.serve import add_cli_args
    from vllm.benchmarks.serve import main as bench_serve
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    for cell in json.loads(Path(plan_path).read_text()):
        result = bench_serve(parser.parse_args(cell["args"]))
        row = {k: v for k, v in cell.items() if k != "args"}
        row.update(completed=result["completed"], failed=result.get("failed", 0),
                   output_tokens_per_s=round(result["output_throughput"], 1), ttft_p50_ms=round(result["median_ttft_ms"], 2),
                   ttft_p99_ms=round(result["p99_ttft_ms"], 2), tpot_p50_ms=round(result["median_tpot_ms"], 3))
        print("S17-CELL " + json.dumps(row), flush=True)


def prompts_for(clients: int, quick: bool) -> int:
    """Requests a cell sends: 8 a client (32 at least), so that a cell's medians rest on more than a
    handful of requests (4 a client before, and single cells moved by 30% between rounds)."""
    return max(8, 2 * clients) if quick else max(32, 8 * clients)


def bench(url: str, model: str, kind: str, clients: int, quick: bool) -> dict:
    """One cell on one server."""
    (row,) = run_plan([{"args": cell_args(url, model, kind, clients, prompts_for(clients, quick))}])
    return row


def run_plan(plan: list[dict]) -> list[dict]:
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(plan, f)
    done = subprocess.run([sys.executable, __file__, "--drive", f.name], capture_output=True, text=True,
                          env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
    return [json.loads(line[len("S17-CELL "):]) for line in done.stdout.splitlines() if line.startswith("S17-CELL ")]


def main() -> None:
    if "--drive" in sys.argv:
        drive(sys.argv[sys.argv.index("--drive") + 1])
        return
    args = parse_args(__doc__.split("\n")[0])
    clients = [1, 4] if args.quick else [1, 4, 16, 64]
    kinds = list(KINDS)
    n_rounds = 1 if args.quick else 3
    model = str(build_tiny_llama(Path(tempfile.mkdtemp(prefix="s17-model-")) / "tiny-llama"))
    with inferd_server(inferd_config(model)) as inferd_url, VllmServe(model) as vllm_url:
        urls = {"inferd": inferd_url, "vllm": vllm_url}
        plan = [{"round": 0, "server": name, "kind": kind, "clients": 1, "args": cell_args(url, model, kind, 1, 4)}
                for kind in kinds for name, url in urls.items()]  # (warm-up: each kind's first requests, not counted)
        for r in range(1, n_rounds + 1):
            i = 0
            for kind in kinds:
                for c in clients:
                    prompts = prompts_for(c, args.quick)
                    order = ("inferd", "vllm") if (r + i) % 2 else ("vllm", "inferd")  # (each goes first in turn)
                    plan += [{"round": r, "server": name, "kind": kind, "clients": c,
                              "args": cell_args(urls[name], model, kind, c, prompts)} for name in order]
                    i += 1
        results = [row for row in run_plan(plan) if row["round"] > 0]
    rounds = []
    for r in range(1, n_rounds + 1):
        row: dict = {"inferd": {k: {} for k in kinds}, "vllm": {k: {} for k in kinds}}
        for cell in results:
            if cell["round"] == r:
                row[cell["server"]][cell["kind"]][str(cell["clients"])] = cell
        rounds.append(row)
    write_report(rounds, kinds, clients, Path(args.out_dir))


def write_report(rounds: list[dict], kinds: list[str], clients: list[int], out: Path) -> None:
    """S17_vllm_serve.json / .md: each cell's medians and ratios, and the ratios pooled by concurrency
    (the geometric mean over kinds and rounds: single cells still swing by 30% on a 2-core machine)."""
    cells = {}
    for kind in kinds:
        for c in clients:
            def ratio(key: str) -> float | None:
                both = [r["inferd"][kind][str(c)][key] / r["vllm"][kind][str(c)][key]
                        for r in rounds if r["vllm"][kind][str(c)][key]]
                return round(statistics.median(both), 3) if both else None
            cells[f"{kind}@{c}"] = {"throughput": ratio("output_tokens_per_s"), "ttft_p99": ratio("ttft_p99_ms"),
                                    "tpot_p50": ratio("tpot_p50_ms")}
    metrics = {"throughput": "output_tokens_per_s", "ttft_p99": "ttft_p99_ms", "ttft_p50": "ttft_p50_ms", "tpot_p50": "tpot_p50_ms"}
    pooled: dict[str, dict[str, float]] = {}
    for label, group in [*((str(c), [c]) for c in clients), ("all", clients)]:
        pooled[label] = {}
        for name, key in metrics.items():
            logs = [math.log(r["inferd"][k][str(c)][key] / r["vllm"][k][str(c)][key])
                    for r in rounds for k in kinds for c in group if r["vllm"][k][str(c)][key]]
            pooled[label][name] = round(math.exp(statistics.mean(logs)), 3)
    (out / "S17_vllm_serve.json").write_text(json.dumps({"rounds": rounds, "ratios": cells, "pooled": pooled, "engine": ENGINE},
                                                        indent=1) + "\n")
    lines = ["### S17: vLLM's own client against inferd and `vllm serve` (tiny random Llama, CPU, same engine settings)", "",
             "| kind @ clients | inferd tok/s | vLLM tok/s | throughput ratio | TTFT p99 ms inferd / vLLM | ratio | "
             "TPOT p50 ms inferd / vLLM | ratio | failed |", "|---|---|---|---|---|---|---|---|---|"]
    for kind in kinds:
        for c in clients:
            i = [r["inferd"][kind][str(c)] for r in rounds]
            v = [r["vllm"][kind][str(c)] for r in rounds]

            def med(cells: list[dict], key: str) -> float:
                return round(statistics.median(x[key] for x in cells), 2)
            ratios = cells[f"{kind}@{c}"]
            lines.append(f"| {kind} @ {c} | {med(i, 'output_tokens_per_s')} | {med(v, 'output_tokens_per_s')} | "
                         f"{ratios['throughput']} | {med(i, 'ttft_p99_ms')} / {med(v, 'ttft_p99_ms')} | {ratios['ttft_p99']} | "
                         f"{med(i, 'tpot_p50_ms')} / {med(v, 'tpot_p50_ms')} | {ratios['tpot_p50']} | "
                         f"{sum(x['failed'] for x in i)} / {sum(x['failed'] for x in v)} |")
    lines += ["", f"Medians of {len(rounds)} round(s); both servers up together, each cell run on one then the other "
              "(who goes first alternates), ratios inferd / vLLM per round, then the median.", "",
              f"Pooled by concurrency: the geometric mean of inferd / vLLM over the {len(kinds)} kinds and {len(rounds)} rounds.", "",
              "| clients | throughput | TTFT p50 | TTFT p99 | TPOT p50 |", "|---|---|---|---|---|"]
    lines += [f"| {label} | {p['throughput']} | {p['ttft_p50']} | {p['ttft_p99']} | {p['tpot_p50']} |" for label, p in pooled.items()]
    (out / "S17_vllm_serve.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
