"""S2, overhead: one simulated GPU at 10 ms per batch, batches up to 100. Ceiling 10,000 req/s.

What the HTTP and batching path costs per request: throughput and the server's CPU µs per request at
100 and 400 closed-loop clients (wrk). Then beside Mosec 0.9.8 (a Rust HTTP front and batcher feeding a
Python worker process) running the same 10 ms sleep-and-uppercase worker, alternated twice. Then the
cost of observability: the same 400-client step with metrics and access logs (1% sampled) on, and with
both off, alternated four times in one run.
"""

from statistics import median

from common import inferd_server, measured_step, median_of, mosec_server, parse_args, save, sim_config, step

OFF = 'metrics = false\naccess_log = "off"'

if __name__ == "__main__":
    args = parse_args(__doc__)
    steps = []
    with inferd_server(sim_config(latency_ms=10)) as url:
        for clients in (100, 400):
            steps.append(step(url, clients=clients, duration_s=10, quick=args.quick, processes=2))
    save("S2", "S2: overhead, 1 simulated GPU, 10 ms/batch, max batch 100", steps, args.out_dir,
         ceiling_rps=10000, floor_ms=10)

    # Beside Mosec, alternated: this machine's speed drifts by 10-20% over minutes.
    versus: list[dict] = []
    with mosec_server(args.quick) as mosec:
        for _round in range(0 if mosec is None else 1 if args.quick else 2):
            with inferd_server(sim_config(latency_ms=10)) as url:
                for clients in (100, 400):
                    result = step(url, clients=clients, duration_s=10, quick=args.quick, processes=2)
                    versus.append({**result, "variant": "inferd"})
            for clients in (100, 400):
                result = measured_step(mosec[0], mosec[1], clients=clients, duration_s=10, quick=args.quick, path="/inference")
                versus.append({**result, "variant": "Mosec 0.9.8"})
    if versus:
        summary = {}
        for clients in (100, 400):
            ours = [s for s in versus if s["variant"] == "inferd" and s["offered"] == clients]
            theirs = [s for s in versus if s["variant"] != "inferd" and s["offered"] == clients]
            summary[f"{clients}_clients"] = {
                "inferd_rps": median_of(ours, "achieved_rps"), "mosec_rps": median_of(theirs, "achieved_rps"),
                "inferd_over_mosec": round(median_of(ours, "achieved_rps") / median_of(theirs, "achieved_rps"), 3),
                "inferd_cpu_us": median_of(ours, "cpu_us_per_request"), "mosec_cpu_us": median_of(theirs, "cpu_us_per_request"),
            }
        versus[-1]["summary"] = summary
        save("S2_mosec", "S2 beside Mosec 0.9.8: the same 10 ms worker, alternated", versus, args.out_dir,
             ceiling_rps=10000, plots=False)
        print(summary)

    # Four alternations: on this machine two runs of the same server differ by up to 20% in CPU.
    observability = []
    for _round in range(4):
        for label, extra in (("on", ""), ("off", OFF)):
            with inferd_server(sim_config(latency_ms=10, extra_server=extra)) as url:
                result = step(url, clients=400, duration_s=10, quick=args.quick, processes=2)
                result["observability"] = label
                result["variant"] = f"metrics + access log {label}"  # the table's first column
                observability.append(result)
    on = [s for s in observability if s["observability"] == "on"]
    off = [s for s in observability if s["observability"] == "off"]

    cpu_on = median([s["server"]["cpu_us_per_request"] for s in on])
    cpu_off = median([s["server"]["cpu_us_per_request"] for s in off])
    rps_on = median([s["achieved_rps"] for s in on])
    rps_off = median([s["achieved_rps"] for s in off])
    summary = {"cpu_us_on": cpu_on, "cpu_us_off": cpu_off, "cpu_ratio": round(cpu_on / cpu_off, 3),
               "rps_on": rps_on, "rps_off": rps_off, "rps_ratio": round(rps_on / rps_off, 3)}
    observability[-1]["summary"] = summary
    save("S2_observability", "S2 at 400 clients: metrics + access logs on vs off (alternated)", observability,
         args.out_dir, ceiling_rps=10000, floor_ms=10, plots=False)
    print(summary)
