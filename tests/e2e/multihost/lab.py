"""A small network of inferd hosts on one machine: network namespaces, veth pairs and a bridge.

Namespaces `<prefix>-h1..h3` (inferd hosts), `<prefix>-lb` (the load balancer), `<prefix>-client` (the
accounting client) and `<prefix>-sw` (the bridge), on one private /24 with no default route anywhere, so
nothing can leave them. Every address a request goes to is asserted to belong to a namespace created
here, and `down()` deletes everything (also at interpreter exit). Needs root and iproute2.
"""

from __future__ import annotations

import atexit
import ipaddress
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=check)


def can_build_labs() -> str | None:
    """None when namespaces can be made here, else why not."""
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    if os.geteuid() != 0:
        return "creating network namespaces needs root"
    probe = f"inferd-probe-{os.getpid()}"
    made = _ip("netns", "add", probe, check=False)
    if made.returncode != 0:
        return f"cannot create network namespaces: {made.stderr.strip()}"
    _ip("netns", "del", probe, check=False)
    return None


class Lab:
    NODES = ("h1", "h2", "h3", "lb", "client")

    def __init__(self, prefix: str = "ifd", subnet: str = "10.213.57.0/24") -> None:
        self.prefix = prefix
        self.subnet = ipaddress.ip_network(subnet)
        hosts = list(self.subnet.hosts())
        self.addresses = {node: str(hosts[10 + i]) for i, node in enumerate(self.NODES)}
        self.processes: list[subprocess.Popen] = []
        self._made: list[str] = []

    def ns(self, node: str) -> str:
        return f"{self.prefix}-{node}"

    # ---- building and tearing down ---------------------------------------------------------------

    def up(self) -> Lab:
        routes = _ip("route", "show", "table", "all").stdout
        assert str(self.subnet.network_address).rsplit(".", 1)[0] not in routes, f"{self.subnet} is in use here"
        atexit.register(self.down)
        switch = self.ns("sw")
        self._add_ns(switch)
        _ip("-n", switch, "link", "add", "br0", "type", "bridge")
        _ip("-n", switch, "link", "set", "br0", "up")
        for node in self.NODES:
            name = self.ns(node)
            self._add_ns(name)
            _ip("-n", name, "link", "set", "lo", "up")
            _ip("link", "add", f"{self.prefix}-{node}-p", "type", "veth", "peer", "name", f"{self.prefix}-{node}-q")
            _ip("link", "set", f"{self.prefix}-{node}-p", "netns", switch)
            _ip("link", "set", f"{self.prefix}-{node}-q", "netns", name)
            _ip("-n", switch, "link", "set", f"{self.prefix}-{node}-p", "master", "br0")
            _ip("-n", switch, "link", "set", f"{self.prefix}-{node}-p", "up")
            _ip("-n", name, "link", "set", f"{self.prefix}-{node}-q", "name", "eth0")
            _ip("-n", name, "addr", "add", f"{self.addresses[node]}/{self.subnet.prefixlen}", "dev", "eth0")
            _ip("-n", name, "link", "set", "eth0", "up")
            assert "default" not in _ip("-n", name, "route").stdout
        return self

    def _add_ns(self, name: str) -> None:
        _ip("netns", "del", name, check=False)  # a leftover of an interrupted run
        _ip("netns", "add", name)
        self._made.append(name)

    def down(self) -> None:
        for proc in self.processes:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
        self.processes.clear()
        for name in reversed(self._made):
            _ip("netns", "del", name, check=False)
        self._made.clear()

    # ---- running things inside -------------------------------------------------------------------

    def target(self, address: str) -> str:
        """An address a request may be sent to: only one of this lab's own."""
        assert address in self.addresses.values(), f"{address} is not in a namespace this lab created"
        return address

    def start(self, node: str, args: list[str], log: Path, env: dict[str, str] | None = None) -> subprocess.Popen:
        out = open(log, "ab")  # noqa: SIM115 - owned by the process
        proc = subprocess.Popen(["ip", "netns", "exec", self.ns(node), *args], stdout=out, stderr=subprocess.STDOUT,
                                env={**os.environ, **(env or {})}, cwd=REPO)
        self.processes.append(proc)
        return proc

    def link(self, node: str, up: bool) -> None:
        _ip("-n", self.ns("sw"), "link", "set", f"{self.prefix}-{node}-p", "up" if up else "down")

    def start_inferd(self, node: str, config: Path, log: Path) -> subprocess.Popen:
        host = self.target(self.addresses[node])
        return self.start(node, [sys.executable, "-m", "inferd", "serve", "--config", str(config), "--host", host,
                                 "--port", "8000", "--log-level", "WARNING"], log)

    def wait_http(self, node_from: str, url: str, timeout_s: float = 60) -> None:
        """Wait until `url` answers 200, asked from inside `node_from`'s namespace."""
        give_up = time.monotonic() + timeout_s
        while time.monotonic() < give_up:
            probe = subprocess.run(["ip", "netns", "exec", self.ns(node_from), sys.executable, "-c",
                                    f"import urllib.request as u; u.urlopen({url!r}, timeout=2)"],
                                   capture_output=True)
            if probe.returncode == 0:
                return
            time.sleep(0.2)
        raise TimeoutError(f"{url} never answered")

    @staticmethod
    def signal(proc: subprocess.Popen, sig: int) -> None:
        """Signal the process `ip netns exec` runs (it execs, so the pid is the same)."""
        if proc.poll() is None:
            os.kill(proc.pid, sig)


__all__ = ["Lab", "can_build_labs", "signal"]
