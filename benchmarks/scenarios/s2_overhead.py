"""S2, overhead: one simulated GPU at 10 ms per batch, batches up to 100. Ceiling 10,000 req/s.

What the HTTP and batching path costs per request: throughput and the server's CPU µs per request at
100 and 400 closed-loop clients (wrk).
"""

from common import inferd_server, parse_args, save, sim_config, step

if __name__ == "__main__":
    args = parse_args(__doc__)
    steps = []
    with inferd_server(sim_config(latency_ms=10)) as url:
        for clients in (100, 400):
            steps.append(step(url, clients=clients, duration_s=10, quick=args.quick, processes=2))
    save("S2", "S2: overhead, 1 simulated GPU, 10 ms/batch, max batch 100", steps, args.out_dir,
         ceiling_rps=10000, floor_ms=10)
