"""Instructions per request on the server's own path, without sockets: the real server in-process, 100
connections whose transports are stand-ins, each handed one `POST /v1/inference` (distinct bodies) per
round, a round answered (a batch of 100 at 1 ms) before the next. Counted by callgrind as the difference
between N rounds and none, so start-up and warm-up cancel out; batches are always full, so what differs
between two variants is per-request work. `callgrind_request.py` counts the same with real sockets, but
under valgrind its batches are small and vary with the variant's timing.

    python inprocess_request.py [--rounds N] [--repeats R]

Compares `[server] fast_path` on and off (the connection's fast path, `inferd/http/fast_path.py`, against
aiohttp's handler path), R times (2); writes inprocess_request.json / .md.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from common import QUIET_BLAS, REPO, RESULTS

_REQUEST = b"POST /v1/inference HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"


async def _drive(rounds: int, fast_path: bool, tree: str) -> None:
    sys.path.insert(0, tree)
    from tests.helpers import RecordingTransport, running_server, sim_model

    answers, wanted, done = 0, 0, asyncio.Event()

    def answered() -> None:  # (a round is over once its answers are all out)
        nonlocal answers
        answers += 1
        if answers >= wanted:
            done.set()

    model = sim_model(latency_ms=1, max_batch_size=100, max_wait_ms=2)
    async with running_server(model, fast_path=fast_path) as srv:
        connections = []
        for _ in range(100):
            connection, transport = srv.connections(), RecordingTransport()
            transport.on_write = answered
            connection.connection_made(transport)  # type: ignore[arg-type]
            connections.append(connection)
        await asyncio.sleep(0.05)  # each connection's request loop waits for its first request
        sent = 0
        for _round in range(20 + rounds):  # (20 to warm up, in both counts)
            for connection in connections:
                body = b'{"input": "E equals %d"}' % sent
                sent += 1
                connection.data_received(_REQUEST % (len(body), body))
            wanted = sent
            done.clear()
            if answers < sent:
                await done.wait()


def instructions_per_request(rounds: int, fast_path: bool, tree: Path = REPO, python: str = sys.executable) -> float:
    """Instructions per request of the server in `tree` (its `inferd` and `tests`) run by the interpreter
    `python`: N rounds less none."""
    return (_instructions(rounds, fast_path, tree, python) - _instructions(0, fast_path, tree, python)) / (rounds * 100)


def _instructions(rounds: int, fast_path: bool, tree: Path, python: str) -> int:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "callgrind.out"
        subprocess.run(["valgrind", "--tool=callgrind", f"--callgrind-out-file={out}", python, __file__,
                        "--drive", str(rounds), str(int(fast_path)), str(tree)], check=True, capture_output=True,
                       env={**os.environ, **QUIET_BLAS, "PYTHONPATH": str(tree)})
        return max(int(m[1]) for m in re.finditer(r"^(?:summary|totals):\s+(\d+)", out.read_text(errors="replace"), re.M))


if __name__ == "__main__":
    if "--drive" in sys.argv:
        import uvloop

        at = sys.argv.index("--drive")
        uvloop.run(_drive(int(sys.argv[at + 1]), sys.argv[at + 2] == "1", sys.argv[at + 3]))
        sys.exit(0)
    rounds = int(sys.argv[sys.argv.index("--rounds") + 1]) if "--rounds" in sys.argv else 100
    repeats = int(sys.argv[sys.argv.index("--repeats") + 1]) if "--repeats" in sys.argv else 2
    runs: dict[str, list[int]] = {"fast path": [], "aiohttp's handler path": []}
    for _ in range(repeats):
        for name, fast in (("fast path", True), ("aiohttp's handler path", False)):
            runs[name].append(round(instructions_per_request(rounds, fast)))
            print(name, runs[name][-1], flush=True)
    median = {name: statistics.median(xs) for name, xs in runs.items()}
    (RESULTS / "inprocess_request.json").write_text(json.dumps({"rounds": rounds, "runs": runs, "median": median,
                                                                 "note": __doc__}, indent=1) + "\n")
    lines = [f"### Instructions per request in-process (callgrind, {rounds} rounds of 100 requests, full batches, "
             f"{repeats} alternated runs)", "", "| path | runs | median |", "|---|---|---|"]
    lines += [f"| {name} | {' / '.join(f'{v:,}' for v in xs)} | {median[name]:,.0f} |" for name, xs in runs.items()]
    (RESULTS / "inprocess_request.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
