"""Mosec 0.9.8 serving the same work as S2's simulated GPU: 10 ms per batch of up to 100, uppercase.

Benchmark-only (S2 runs it beside inferd); it runs in its own virtual environment,
benchmarks/.mosec-venv, which `benchmarks/scenarios/s2_overhead.py` creates on first use.
"""

import time

from mosec import Server, Worker


class Upper(Worker):
    def forward(self, data: list) -> list:
        time.sleep(0.010)
        return [{"output": item["input"].upper()} for item in data]


if __name__ == "__main__":
    server = Server()
    server.append_worker(Upper, max_batch_size=100, max_wait_time=20)
    server.run()
