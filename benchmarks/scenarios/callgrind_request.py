"""Instructions per request on S2's path, counted by callgrind: the server (the simulated GPU, 10 ms per
batch of up to 100) runs under valgrind with instrumentation off through start-up and a warm-up, then on for
N requests from 100 closed-loop clients with distinct bodies, then off. Instructions are the one
figure on this machine that does not drift with its neighbours; wall time under valgrind means nothing.
Under valgrind batches are smaller than under real load (the server is ~50x slower, the sleep is not),
so the per-batch work weighs more than it would.

    python callgrind_request.py [--baseline-tree DIR] [--requests N] [--rounds R] [--max-batch B] [--tracing]

Alternates this checkout and the baseline R times (2); writes callgrind_request.json / .md, with each
run's requests per batch (a tree that answers sooner can get smaller batches here, and more per-batch
work per request: compare instructions at like batch sizes; `--max-batch 10` keeps every batch full). `--tracing`: this
checkout with tracing off, on at 1% with inferd's OTLP/JSON exporter and with the SDK's protobuf one
(spans to a sink on loopback that answers 200) instead; writes callgrind_tracing.json / .md.
"""

from __future__ import annotations

import asyncio
import http.server
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import aiohttp
from common import QUIET_BLAS, REPO, RESULTS, SCENARIOS, free_port, sim_config


async def _load(url: str, first: int, count: int, clients: int) -> None:
    """`count` requests from `clients` closed-loop clients, each body distinct; every answer must be 200."""
    numbers = iter(range(first, first + count))
    async with aiohttp.ClientSession() as http:
        async def client() -> None:
            for i in numbers:
                async with http.post(f"{url}/v1/inference", json={"input": f"E equals {i}"}) as resp:
                    await resp.read()
                    assert resp.status == 200, resp.status
        await asyncio.gather(*(client() for _ in range(clients)))


class _Sink(http.server.BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 (the handler's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def count(tree: Path, requests: int, clients: int = 100, extra_toml: str = "", max_batch: int = 100) -> float:
    """Instructions per request for the inferd in `tree`."""
    port = free_port()
    with tempfile.TemporaryDirectory() as tmp:
        config = Path(tmp) / "s2.toml"
        # (deadlines far off: under valgrind the server is ~50x slower, and a refusal would count as a request)
        config.write_text(sim_config(latency_ms=10, max_batch=max_batch,
                                     extra_model="timeout_ms = 600000\nmax_timeout_ms = 600000") + extra_toml)
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), str(SCENARIOS)])}
        command = [sys.executable, "-m", "inferd", "serve", "--config", str(config), "--port", str(port),
                   "--log-level", "WARNING"]
        return count_server(command, tree, env, f"http://127.0.0.1:{port}", "/readyz", _batches, requests, clients)


def count_server(command: list[str], cwd: Path, env: dict[str, str], url: str, ready_path: str,
                 batches: Callable[[str], int], requests: int, clients: int = 100) -> float:
    """Instructions per request of a server (`command`, serving `url`) run under valgrind with
    instrumentation off until it is ready and warm, then on for `requests` from `clients` closed-loop
    clients (`batches(url)`: the batches it has run, for the requests per batch)."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        server = subprocess.Popen(["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                                   *command], cwd=cwd, env={**env, **QUIET_BLAS}, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            give_up = time.monotonic() + 600
            while True:
                try:
                    with urllib.request.urlopen(f"{url}{ready_path}", timeout=5) as resp:
                        if resp.status == 200:
                            break
                except OSError:
                    if time.monotonic() > give_up or server.poll() is not None:
                        raise RuntimeError("the server under valgrind never became ready") from None
                    time.sleep(1)
            asyncio.run(_load(url, 0, 500, clients))  # warm: every code path compiled, caches filled
            ran = batches(url)
            subprocess.run(["callgrind_control", "-i", "on", str(server.pid)], check=True, capture_output=True)
            asyncio.run(_load(url, 1_000_000, requests, clients))
            subprocess.run(["callgrind_control", "-i", "off", str(server.pid)], check=True, capture_output=True)
            ran = batches(url) - ran
        finally:
            server.terminate()
            server.wait(timeout=300)
        totals = [int(m[1]) for f in Path(tmp).glob("callgrind.out*")
                  for m in re.finditer(r"^(?:summary|totals):\s+(\d+)", f.read_text(errors="replace"), re.M)]
        MEAN_BATCH.append(round(requests / max(1, ran), 1))
        return max(totals) / requests


MEAN_BATCH: list[float] = []  # each count's requests per batch: the per-batch work is spread over this many


def _batches(url: str) -> int:
    with urllib.request.urlopen(f"{url}/v1/stats", timeout=60) as resp:
        return sum(m["batches"] for m in json.loads(resp.read())["models"].values())


def tracing_variants(n: int, rounds: int) -> None:
    sink = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_port}/v1/traces"

    def table(exporter: str) -> str:
        return f'\n[tracing]\nsample_rate = 0.01\nexporter = "{exporter}"\nendpoint = "{endpoint}"\n'

    variants = {"off": "", "on at 1%, OTLP/JSON (inferd's)": table("otlp"),
                "on at 1%, OTLP protobuf (the SDK's)": table("otlp-protobuf")}
    runs: dict[str, list[float]] = {name: [] for name in variants}
    for _round in range(rounds):
        for name, extra in variants.items():
            runs[name].append(round(count(REPO, n, extra_toml=extra)))
            print(name, runs[name][-1], flush=True)
    sink.shutdown()
    off = statistics.median(runs["off"])
    (RESULTS / "callgrind_tracing.json").write_text(json.dumps({"requests": n, "runs": runs, "note": __doc__}, indent=1) + "\n")
    lines = [f"### Tracing's instructions per S2 request (callgrind, {n} requests, 100 clients, {rounds} alternated run(s))", "",
             "| tracing | runs | median | over off |", "|---|---|---|---|"]
    lines += [f"| {name} | {' / '.join(f'{v:,}' for v in xs)} | {statistics.median(xs):,.0f} | "
              f"{statistics.median(xs) / off:.3f} |" for name, xs in runs.items()]
    (RESULTS / "callgrind_tracing.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 2
    if "--tracing" in sys.argv:
        tracing_variants(int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 3000, rounds)
        sys.exit(0)
    baseline = sys.argv[sys.argv.index("--baseline-tree") + 1] if "--baseline-tree" in sys.argv else None
    n = int(sys.argv[sys.argv.index("--requests") + 1]) if "--requests" in sys.argv else 3000
    max_batch = int(sys.argv[sys.argv.index("--max-batch") + 1]) if "--max-batch" in sys.argv else 100
    trees = {"this checkout": REPO, **({"baseline": Path(baseline)} if baseline else {})}
    runs: dict[str, list[float]] = {name: [] for name in trees}
    batch_sizes: dict[str, list[float]] = {name: [] for name in trees}
    for _round in range(rounds):
        for name, tree in trees.items():
            runs[name].append(round(count(tree, n, max_batch=max_batch)))
            batch_sizes[name].append(MEAN_BATCH[-1])
            print(name, runs[name][-1], batch_sizes[name][-1], flush=True)
    summary = {name: statistics.median(values) for name, values in runs.items()}
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "callgrind_request.json").write_text(json.dumps({"requests": n, "runs": runs, "median": summary,
                                                                "mean_batch": batch_sizes, "note": __doc__}, indent=1) + "\n")
    lines = [f"### Instructions per S2 request (callgrind, {n} requests, 100 clients, batches of up to {max_batch}, "
             f"{rounds} alternated run(s))", "",
             "| tree | runs | median | requests per batch |", "|---|---|---|---|"]
    lines += [f"| {name} | {' / '.join(f'{v:,}' for v in runs[name])} | {summary[name]:,.0f} | "
              f"{' / '.join(f'{b:g}' for b in batch_sizes[name])} |" for name in runs]
    (RESULTS / "callgrind_request.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
