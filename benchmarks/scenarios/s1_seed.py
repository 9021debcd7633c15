"""S1, the seed's workload: one simulated GPU, 100 ms per batch, batches up to 100, linger 20 ms.

Ceiling 1,000 req/s, floor 100 ms. Closed loop (wrk) at 1, 100 and 400 clients, then an open-loop
Poisson sweep drawn beside the ideal server's curve.
"""

from common import ideal_curve, inferd_server, parse_args, save, sim_config, step

OPEN_RATES = [50, 200, 500, 800, 900, 950, 980]

if __name__ == "__main__":
    args = parse_args(__doc__)
    steps = []
    with inferd_server(sim_config(latency_ms=100)) as url:
        for clients in (1, 100, 400):
            steps.append(step(url, clients=clients, duration_s=10, quick=args.quick))
        for rate in OPEN_RATES:
            steps.append(step(url, rate=rate, duration_s=10, quick=args.quick))
    save("S1", "S1: seed workload, 1 simulated GPU, 100 ms/batch, max batch 100", steps, args.out_dir,
         ceiling_rps=1000, floor_ms=100, ideal=ideal_curve(OPEN_RATES, 0.1, 100, 0.02))
