"""The Open Inference Protocol over gRPC against HTTP (issue 52), side by side in one run on one server.

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
from pathlib import Path
from typing import Any

import numpy as np
from common import RESULTS, free_port, inferd_process, parse_args, process_tree_cpu_s, sim_config, step
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


def main() -> None:
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


if __name__ == "__main__":
    main()
