"""What the wire costs: two measurements of inferd's answers on the wire and on the event loop.

    .venv/bin/python benchmarks/scenarios/wire.py grpc       # grpc_vs_http.{md,json}, ~8 minutes
    .venv/bin/python benchmarks/scenarios/wire.py vectors    # vector_types.{md,json}, ~3 minutes

`grpc`: The Open Inference Protocol over gRPC against HTTP (issue 52), side by side in one run on one server.

Load: the seed's workload (the simulated GPU, 100 ms per batch of up to 100, 20 ms linger) at 100 and
400 closed-loop clients, every request a distinct input. Three arms, alternated round by round:
- `grpc`: ModelInfer over one HTTP/2 channel per load process (grpcio's asyncio client, requests built
  as tritonclient builds them: the input in `raw_input_contents`);
- `http v2`: the same protocol over HTTP/1.1 (`POST /v2/models/batchstring/infer`, JSON), sent by the
  project's Python load generator (aiohttp), so both arms' clients are Python on asyncio;
- `http v2 wrk`: that route again, sent by wrk (C), the lightest client this machine has;
- `grpc floor`: the `grpc` arm's load against a bare grpcio asyncio server whose ModelInfer only waits
  100 ms and answers (no batching, no admission): what gRPC's own machinery costs a call in Python.
Each arm: 2 load processes; the server's CPU per answered request read from /proc over the measured
window (its whole process), its throughput, and the clients' p50/p99.

Then one client at a time: `tritonclient.grpc` against `tritonclient.http` (its binary tensors) asking
for one 384-float MiniLM embedding (the real tokeniser and output rows, the GPU a 1 ms stand-in),
blocks of calls alternated: the round trips' medians.

`vectors`: compact vectors on the wire: MiniLM's embeddings (the real tokenizer and output rows, the forward a
stand-in sleeping 3 ms a batch, `gpu_standin`) as float, base64, int8 and binary, and cut to 128
dimensions, float and int8. Each a `/v1/embeddings` call of 32 distinct texts from wrk's 32 clients;
per variant: the answer's bytes, calls/s, and the event loop's CPU (the server's main thread, from
/proc) per call, beside float's in the same run. Rounds alternate the variants (this machine is noisy);
the figures are medians.
"""

from __future__ import annotations

import asyncio
import json
import multiprocessing
import statistics
import struct
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    RESULTS,
    free_port,
    inferd_process,
    main_thread_cpu_s,
    parse_args,
    process_tree_cpu_s,
    sim_config,
    step,
)
from s9_real_frontend import standin_config

CLIENTS = (100, 400)
V2_BODY = b'{"inputs": [{"name": "text", "datatype": "BYTES", "shape": [1], "data": ["E equals {i}"]}]}'
INFER = "/inference.GRPCInferenceService/ModelInfer"


def _grpc_client_process(target: str, clients: int, measure_from: float, stop: float, index: int, out: Any) -> None:
    """One load process: `clients` callers in a closed loop on one channel until `stop` (wall clock);
    the round trips of the calls answered from `measure_from` on."""
    import grpc
    from tritonclient.grpc import service_pb2 as pb

    def request(i: int) -> bytes:
        message = pb.ModelInferRequest(model_name="batchstring")
        message.inputs.add(name="text", datatype="BYTES", shape=[1])
        text = f"E equals {index}-{i}".encode()
        message.raw_input_contents.append(struct.pack("<I", len(text)) + text)
        return message.SerializeToString()

    async def main() -> dict[str, Any]:
        async with grpc.aio.insecure_channel(target) as channel:
            call = channel.unary_unary(INFER)  # (bytes in, bytes out: the message built above)
            latencies: list[float] = []
            errors = 0
            counter = iter(range(10**9))

            async def caller() -> None:
                nonlocal errors
                while (sent := time.time()) < stop:
                    try:
                        await call(request(next(counter)), timeout=30)
                    except grpc.aio.AioRpcError:
                        errors += 1
                        continue
                    if measure_from <= (done := time.time()) < stop:
                        latencies.append(done - sent)

            await asyncio.gather(*(caller() for _ in range(clients)))
            return {"latencies": latencies, "errors": errors}

    out.put(asyncio.run(main()))


def grpc_step(target: str, pid: int, clients: int, duration_s: float, warmup_s: float = 2.0,
              processes: int = 2) -> dict[str, Any]:
    """A closed-loop step of gRPC calls; the server's CPU over exactly the window its answers are counted in."""
    spawn = multiprocessing.get_context("spawn")
    out: Any = spawn.Queue()
    measure_from = time.time() + 3.0 + warmup_s  # (the processes' own start first: imports)
    stop = measure_from + duration_s
    workers = [spawn.Process(target=_grpc_client_process, args=(target, clients // processes, measure_from, stop, k, out))
               for k in range(processes)]
    for w in workers:
        w.start()
    time.sleep(max(0.0, measure_from - time.time()))
    before = process_tree_cpu_s(pid)
    time.sleep(max(0.0, stop - time.time()))
    cpu = process_tree_cpu_s(pid) - before
    results = [out.get(timeout=120) for _ in workers]
    for w in workers:
        w.join()
    latencies = sorted(x for r in results for x in r["latencies"])
    completed = len(latencies)
    return {"achieved_rps": round(completed / duration_s, 1), "errors": sum(r["errors"] for r in results),
            "p50_ms": round(latencies[completed // 2] * 1000, 2), "p99_ms": round(latencies[int(completed * 0.99)] * 1000, 2),
            "server_cpu_us_per_request": round(cpu / max(1, completed) * 1e6, 1)}


# A ModelInfer handler that does nothing but wait the simulated batch's 100 ms and answer one BYTES
# element: what grpcio's asyncio server itself costs a call (the floor under any gRPC handler).
FLOOR_SERVER = """
import asyncio, sys, grpc, uvloop
from tritonclient.grpc import service_pb2 as pb, service_pb2_grpc as pb_grpc
class Floor(pb_grpc.GRPCInferenceServiceServicer):
    async def ModelInfer(self, request, context):
        await asyncio.sleep(0.1)
        answer = pb.ModelInferResponse(model_name=request.model_name)
        answer.outputs.add(name="output", datatype="BYTES", shape=[1])
        answer.raw_output_contents.append(request.raw_input_contents[0])
        return answer
async def main():
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    pb_grpc.add_GRPCInferenceServiceServicer_to_server(Floor(), server)
    server.add_insecure_port("127.0.0.1:" + sys.argv[1])
    await server.start()
    await server.wait_for_termination()
uvloop.run(main())
"""


def grpc_floor_step(clients: int, duration_s: float) -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", FLOOR_SERVER, str(port)])
    try:
        time.sleep(2.0)
        return grpc_step(f"127.0.0.1:{port}", server.pid, clients, duration_s)
    finally:
        server.terminate()
        server.wait()


def http_step(url: str, pid: int, clients: int, duration_s: float, engine: str) -> dict[str, Any]:
    kw = dict(clients=clients, quick=False, path="/v2/models/batchstring/infer", body=V2_BODY, stats_path=None,
              processes=2, engine=engine)
    step(url, duration_s=2, warmup_s=0, **kw)  # type: ignore[arg-type]
    before = process_tree_cpu_s(pid)
    result = step(url, duration_s=duration_s, warmup_s=0, **kw)  # type: ignore[arg-type]
    cpu = process_tree_cpu_s(pid) - before
    return {"achieved_rps": result["achieved_rps"], "errors": result.get("errors", 0),
            "p50_ms": result["latency_ms"]["p50"], "p99_ms": result["latency_ms"]["p99"],
            "server_cpu_us_per_request": round(cpu / max(1, result["completed"]) * 1e6, 1)}


def round_trips(url: str, grpc_target: str, blocks: int, per_block: int) -> dict[str, float]:
    """Sequential infer calls of one text to the MiniLM stand-in, tritonclient over gRPC and over HTTP."""
    import tritonclient.grpc as tgrpc
    import tritonclient.http as thttp

    clients = {"grpc": (tgrpc, tgrpc.InferenceServerClient(grpc_target)),
               "http": (thttp, thttp.InferenceServerClient(url.removeprefix("http://")))}
    times: dict[str, list[float]] = {"grpc": [], "http": []}
    for block in range(blocks + 1):
        for name, (module, client) in clients.items():
            for i in range(per_block):
                text = module.InferInput("text", [1], "BYTES")
                text.set_data_from_numpy(np.array([f"a sentence to embed, number {block}-{i}".encode()], dtype=object))
                sent = time.perf_counter()
                vector = client.infer("minilm", [text]).as_numpy("output")
                if block:  # (the first block warms both up)
                    times[name].append(time.perf_counter() - sent)
                assert vector.shape == (1, 384)
    for _, client in clients.values():
        client.close()
    return {f"{name}_median_ms": round(statistics.median(t) * 1000, 3) for name, t in times.items()} | {
        "grpc_over_http": round(statistics.median(times["grpc"]) / statistics.median(times["http"]), 3)}


def grpc_main() -> None:
    """`wire.py grpc`: KServe v2 over gRPC against HTTP."""
    args = parse_args(__doc__)
    rounds, duration = (1, 3.0) if args.quick else (3, 10.0)
    grpc_port = free_port()
    steps: list[dict[str, Any]] = []
    with inferd_process(sim_config(latency_ms=100, extra_server=f"grpc_port = {grpc_port}")) as (url, pid):
        target = f"127.0.0.1:{grpc_port}"
        for r in range(rounds):
            for clients in CLIENTS:
                arms = {"grpc": lambda: grpc_step(target, pid, clients, duration),
                        "http v2": lambda: http_step(url, pid, clients, duration, "python"),
                        "http v2 wrk": lambda: http_step(url, pid, clients, duration, "wrk"),
                        "grpc floor": lambda: grpc_floor_step(clients, duration)}
                for arm, run in arms.items():
                    result = run() | {"arm": arm, "clients": clients, "round": r}
                    print(json.dumps(result), file=sys.stderr)
                    steps.append(result)
    grpc_port = free_port()
    with inferd_process(standin_config("gpu_ms = 1").replace("[server]\n", f"[server]\ngrpc_port = {grpc_port}\n")) as (url, _):
        trips = round_trips(url, f"127.0.0.1:{grpc_port}", blocks=3 if args.quick else 10, per_block=50)
    summary = {}
    for clients in CLIENTS:
        for arm in ("grpc", "http v2", "http v2 wrk", "grpc floor"):
            mine = [s for s in steps if s["arm"] == arm and s["clients"] == clients]
            summary[f"{arm} {clients}"] = {key: statistics.median(s[key] for s in mine)
                                           for key in ("achieved_rps", "server_cpu_us_per_request", "p50_ms", "p99_ms")}
    out = Path(args.out_dir or RESULTS)
    out.mkdir(parents=True, exist_ok=True)
    (out / "grpc_vs_http.json").write_text(json.dumps({"summary": summary, "round_trips": trips, "steps": steps,
                                                       "note": __doc__}, indent=2) + "\n")
    lines = ["### KServe v2 over gRPC against HTTP, the seed's workload (medians of the rounds)", "",
             "| arm | clients | req/s | server CPU µs/req | p50 ms | p99 ms | req/s / http v2's | CPU / http v2's |",
             "|---|---|---|---|---|---|---|---|"]
    for key, s in summary.items():
        arm, clients = key.rsplit(" ", 1)
        http = summary[f"http v2 {clients}"]
        lines.append(f"| {arm} | {clients} | {s['achieved_rps']:,.0f} | {s['server_cpu_us_per_request']} | {s['p50_ms']} | "
                     f"{s['p99_ms']} | {s['achieved_rps'] / http['achieved_rps']:.3f} | "
                     f"{s['server_cpu_us_per_request'] / http['server_cpu_us_per_request']:.3f} |")
    lines += ["", f"One 384-float MiniLM embedding, one client at a time: tritonclient.grpc {trips['grpc_median_ms']} ms, "
              f"tritonclient.http {trips['http_median_ms']} ms (median round trips; gRPC / HTTP {trips['grpc_over_http']})."]
    (out / "grpc_vs_http.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


VECTORS_CONFIG = """
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


def vectors_main() -> None:
    """`wire.py vectors`: compact vector types."""
    args = parse_args(__doc__ or "")
    seconds = 3.0 if args.quick else 8.0
    rows: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with inferd_process(VECTORS_CONFIG) as (url, pid):
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
    modes = {"grpc": grpc_main, "vectors": vectors_main}
    if len(sys.argv) < 2 or sys.argv[1] not in modes:
        sys.exit(f"usage: wire.py {{grpc|vectors}} [--quick] [--out-dir DIR]\n\n{__doc__}")
    modes[sys.argv.pop(1)]()
