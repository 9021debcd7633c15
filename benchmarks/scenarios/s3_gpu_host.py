"""S3, a GPU host: eight simulated GPUs in one process, 100 ms per batch, batches up to 100.

Ceiling 8,000 req/s, floor 100 ms. Closed loop (wrk) at 800 and 1,600 clients: 800 fill the eight
batches exactly, 1,600 keep a full batch waiting for every GPU.
"""

from common import inferd_server, parse_args, save, sim_config, step

if __name__ == "__main__":
    args = parse_args(__doc__)
    steps = []
    with inferd_server(sim_config(latency_ms=100, workers=8, max_queue=8000)) as url:
        for clients in (800, 1600):
            steps.append(step(url, clients=clients, duration_s=10, quick=args.quick, processes=2))
    save("S3", "S3: GPU host, 8 simulated GPUs, 100 ms/batch, max batch 100", steps, args.out_dir,
         ceiling_rps=8000, floor_ms=100)
