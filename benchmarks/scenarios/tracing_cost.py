"""What tracing costs the request path: S2 (10 ms per batch of up to 100, wrk at 100 and 400 clients)
with tracing off, on at 1% (inferd's OTLP/JSON exporter, and the SDK's protobuf one) and on at 100%,
alternated round by round in one run. Spans go through the batching processor and the exporter to a
sink in another process that answers 200: encoding and sending included, without a collector's. The
figures are medians of the server's CPU µs per request and of throughput, and the median of the
round-by-round ratios of CPU per request to tracing off's (this machine drifts between rounds).

    python tracing_cost.py [--rounds N] [--variants "off,on at 1%"] [--name NAME] [--quick] [--out-dir DIR]

Writes NAME.json / .md (tracing_cost).
"""

from __future__ import annotations

import json
import multiprocessing
import statistics
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

from common import RESULTS, free_port, inferd_server, own_option, parse_args, sim_config, step

BODY = b'{"input": "E equals {i}"}'
CLIENTS = (100, 400)
TRACING = '\n[tracing]\nsample_rate = {rate}\nexporter = "{exporter}"\nendpoint = "http://127.0.0.1:{port}/v1/traces"\n'
VARIANTS = {"off": None, "on at 1%": (0.01, "otlp"), "on at 1%, SDK protobuf": (0.01, "otlp-protobuf"),
            "on at 100%": (1.0, "otlp")}


class _Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that reads each export and answers 200 with an empty response."""

    def do_POST(self) -> None:  # noqa: N802 (the handler's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


def _sink(port: int) -> None:
    HTTPServer(("127.0.0.1", port), _Sink).serve_forever()


if __name__ == "__main__":
    rounds_given, variants_given, out_name = own_option("--rounds"), own_option("--variants"), own_option("--name")
    out_name = out_name or "tracing_cost"
    if variants_given:
        VARIANTS = {variant: VARIANTS[variant] for variant in variants_given.split(",")}
        if "off" not in VARIANTS:
            raise SystemExit("--variants must include off (the ratios are to it)")
    args = parse_args(__doc__)
    runs: dict[str, dict[int, list[dict[str, float]]]] = {v: {c: [] for c in CLIENTS} for v in VARIANTS}
    port = free_port()
    sink = multiprocessing.get_context("spawn").Process(target=_sink, args=(port,), daemon=True)
    sink.start()
    rounds = 1 if args.quick else int(rounds_given or 5)
    for _ in range(rounds):
        for variant, setting in VARIANTS.items():
            table = "" if setting is None else TRACING.format(rate=setting[0], exporter=setting[1], port=port)
            with inferd_server(sim_config(latency_ms=10) + table) as url:
                for clients in CLIENTS:
                    r = step(url, clients=clients, duration_s=8, quick=args.quick, processes=2, body=BODY)
                    runs[variant][clients].append({"rps": r["achieved_rps"], "cpu_us": r["server"]["cpu_us_per_request"]})
    sink.terminate()
    summary = {variant: {c: {"rps": round(statistics.median(x["rps"] for x in xs), 1),
                             "cpu_us": statistics.median(x["cpu_us"] for x in xs),
                             "paired_cpu_ratio": round(statistics.median(
                                 x["cpu_us"] / off["cpu_us"] for x, off in zip(xs, runs["off"][c], strict=True)), 3)}
                         for c, xs in by.items()}
               for variant, by in runs.items()}
    out = Path(args.out_dir or RESULTS)
    (out / f"{out_name}.json").write_text(json.dumps({"summary": summary, "runs": runs, "note": __doc__}, indent=1) + "\n")
    lines = [f"### Tracing's cost on S2 (medians of {rounds} alternated rounds)", "",
             "| tracing | clients | req/s | CPU µs/req | CPU over off (of the medians) | CPU over off (median of the rounds' ratios) |",
             "|---|---|---|---|---|---|"]
    for variant, by in summary.items():
        for clients, s in by.items():
            ratio = s["cpu_us"] / summary["off"][clients]["cpu_us"]
            lines.append(f"| {variant} | {clients} | {s['rps']:,.0f} | {s['cpu_us']} | {ratio:.3f} | {s['paired_cpu_ratio']:.3f} |")
    (out / f"{out_name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
