"""Watches one host through the load balancer's eyes and its own, to time ejection and rejoining.

Run inside the lab's load-balancer namespace, beside the balancer:

    python -m tests.e2e.multihost.watch --balancer envoy --admin 127.0.0.1:9901 --host ADDR:8000 --out watch.jsonl

Every 50 ms it asks the balancer whether it routes to the host (HAProxy: the server's status on the stats
socket; Envoy: the host's health flags on the admin page) and, on a thread of its own so that a frozen
host cannot stall the first question, asks the host's `/readyz` itself. Each change is one JSON line:
`{"t": unix time, "what": "balancer" | "host", "state": ...}`. Balancer states: "up" (routes to it) or
what the balancer says instead; host states: "ready", "not_ready" (503) or "down" (no answer).
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
import urllib.error
import urllib.request

PERIOD_S = 0.05


def haproxy_state(stats_socket: str, backend: str, server: str) -> str:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(1)
        s.connect(stats_socket)
        s.sendall(b"show stat\n")
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    header, *rows = data.decode().splitlines()
    columns = header.lstrip("# ").split(",")
    for row in rows:
        fields = dict(zip(columns, row.split(",")))
        if fields.get("pxname") == backend and fields.get("svname") == server:
            status = fields["status"]  # "UP", "UP 1/2" (still routed to), "DOWN", "DRAIN", "MAINT", "NOLB"...
            return "up" if status.startswith("UP") else status
    return "absent"


def envoy_state(admin: str, cluster: str, host: str) -> str:
    with urllib.request.urlopen(f"http://{admin}/clusters", timeout=1) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(f"{cluster}::{host}::health_flags::"):
            flags = line.rsplit("::", 1)[1]
            return "up" if flags == "healthy" else flags
    return "absent"


def readiness(host: str) -> str:
    try:
        with urllib.request.urlopen(f"http://{host}/readyz", timeout=0.3):
            return "ready"
    except urllib.error.HTTPError:
        return "not_ready"
    except OSError:
        return "down"


class ChangeLog:
    def __init__(self, path: str) -> None:
        self._file = open(path, "a")  # noqa: SIM115 - open for the life of the process
        self._lock = threading.Lock()
        self._last: dict[str, str] = {}

    def record(self, what: str, state: str) -> None:
        with self._lock:
            if self._last.get(what) != state:
                self._last[what] = state
                self._file.write(json.dumps({"t": time.time(), "what": what, "state": state}) + "\n")
                self._file.flush()


def poll(log: ChangeLog, what: str, probe, stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            state = probe()
        except OSError as exc:
            state = f"unreachable: {type(exc).__name__}"
        log.record(what, state)
        stop.wait(PERIOD_S)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--balancer", choices=["haproxy", "envoy"], required=True)
    parser.add_argument("--admin", required=True, help="HAProxy: the stats socket's path; Envoy: the admin address")
    parser.add_argument("--host", required=True, help="ADDR:PORT of the watched host")
    parser.add_argument("--server-name", default="host1", help="HAProxy's name for the host")
    parser.add_argument("--duration", type=float, default=120)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    log = ChangeLog(args.out)
    if args.balancer == "haproxy":
        def balancer() -> str:
            return haproxy_state(args.admin, "inferd_hosts", args.server_name)
    else:
        def balancer() -> str:
            return envoy_state(args.admin, "inferd_hosts", args.host)
    stop = threading.Event()
    threads = [threading.Thread(target=poll, args=(log, "balancer", balancer, stop), daemon=True),
               threading.Thread(target=poll, args=(log, "host", lambda: readiness(args.host), stop), daemon=True)]
    for t in threads:
        t.start()
    stop.wait(args.duration)  # bounded: the harness also ends it when the scenario is over
    stop.set()


if __name__ == "__main__":
    main()
