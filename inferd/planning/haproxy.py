"""The live fleet's balancer: an HAProxy of our own, `leastconn` over a fixed set of slots (one port
each, out of rotation until a replica there is ready), steered over its runtime API (the stats socket):
the simulator's least-connections balancer, as a real one."""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
from pathlib import Path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Balancer:
    """HAProxy on 127.0.0.1:`port` in front of `slots` replica ports (`async with` it)."""

    def __init__(self, slots: int, workdir: Path) -> None:
        self.workdir = workdir
        self.ports = [free_port() for _ in range(slots)]  # a replica in slot i listens on ports[i]
        self.port = free_port()
        self._socket = str(workdir / "haproxy.sock")
        self._process: subprocess.Popen | None = None

    def config(self) -> str:
        servers = "\n".join(f"    server s{i} 127.0.0.1:{port} disabled" for i, port in enumerate(self.ports))
        return f"""global
    stats socket {self._socket} mode 600 level admin
    maxconn 4000
defaults
    mode http
    timeout connect 1s
    timeout client 30s
    timeout server 30s
    retries 0
frontend inferd
    bind 127.0.0.1:{self.port}
    default_backend replicas
backend replicas
    balance leastconn
{servers}
"""

    async def __aenter__(self) -> Balancer:
        self.workdir.mkdir(parents=True, exist_ok=True)
        config = self.workdir / "haproxy.cfg"
        config.write_text(self.config())
        self._process = process = subprocess.Popen(["haproxy", "-f", str(config)], stdout=subprocess.DEVNULL,
                                                   stderr=open(self.workdir / "haproxy.log", "w"))  # noqa: SIM115 - the process owns it
        for _ in range(100):
            if os.path.exists(self._socket) or process.poll() is not None:
                break
            await asyncio.sleep(0.05)
        if not os.path.exists(self._socket):
            raise RuntimeError(f"haproxy did not start: {(self.workdir / 'haproxy.log').read_text()}")
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)

    def serve(self, slot: int) -> None:
        """Put the replica in `slot` in rotation."""
        self._tell(f"set server replicas/s{slot} state ready")

    def withdraw(self, slot: int) -> None:
        """No new requests to `slot` (those it holds are still answered through it)."""
        self._tell(f"set server replicas/s{slot} state maint")

    def _tell(self, command: str) -> str:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2)
            s.connect(self._socket)
            s.sendall(command.encode() + b"\n")
            answer = b""
            while chunk := s.recv(65536):
                answer += chunk
        return answer.decode()
