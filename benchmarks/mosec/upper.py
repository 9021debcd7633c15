"""Mosec 0.9.8 serving the same work as S2's simulated GPU: 10 ms per batch of up to 100, uppercase
(UPPER_BATCH_MS sets another time a batch: 100 for the seed's, in `closed_loop_sweep.py`).

Benchmark-only (S2 runs it beside inferd); it runs in its own virtual environment,
benchmarks/.mosec-venv, which `benchmarks/scenarios/common.mosec_server` creates on first use (S2, the closed-loop sweep).
"""

import os
import time

from mosec import Server, Worker

BATCH_S = float(os.environ.get("UPPER_BATCH_MS", "10")) / 1000


class Upper(Worker):
    def forward(self, data: list) -> list:
        time.sleep(BATCH_S)
        return [{"output": item["input"].upper()} for item in data]


if __name__ == "__main__":
    server = Server()
    server.append_worker(Upper, max_batch_size=100, max_wait_time=20)
    server.run()
