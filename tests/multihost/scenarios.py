"""Fault scenarios on the lab: three inferd hosts behind a load balancer, a fault on host 1 mid-run.

Used by the test suite (the scenarios that must lose nothing) and by benchmarks/s8_multihost.py (all
of them, with figures).
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time
from pathlib import Path

from .lab import REPO, Lab

HOSTS = ("h1", "h2", "h3")
FAULTS = ("sigterm", "sigkill", "restart", "link_down", "sigstop", "overload")

HOST_CONFIG = """
[server]
grace_period_s = 10
agent_port = 8001
access_log_sample_rate = 1.0

[[models]]
name = "batchstring"
backend = "inferd.backends.sim:create"
max_batch_size = 100
max_wait_ms = 20
max_queue = {max_queue}
timeout_ms = 15000
[models.options]
latency_ms = {latency_ms}
"""


def envoy_binary() -> str | None:
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    import shutil

    return shutil.which("envoy")


def start_balancer(lab: Lab, kind: str, workdir: Path) -> subprocess.Popen:
    lb = lab.addresses["lb"]
    hosts = [lab.target(lab.addresses[h]) for h in HOSTS]
    if kind == "haproxy":
        env = {"INFERD_LISTEN": f"{lb}:8080", **{f"INFERD_HOST{i + 1}": f"{a}:8000" for i, a in enumerate(hosts)}}
        return lab.start("lb", ["haproxy", "-f", str(REPO / "deploy/haproxy/haproxy.cfg")], workdir / "lb.log", env)
    config = (REPO / "deploy/envoy/envoy.yaml").read_text().replace("0.0.0.0", lb)
    for i, address in enumerate(hosts):
        config = config.replace(f"10.0.0.1{i + 1}", address)
    rendered = workdir / "envoy.yaml"
    rendered.write_text(config)
    return lab.start("lb", [envoy_binary(), "-c", str(rendered), "--log-level", "warn", "--disable-hot-restart"],
                     workdir / "lb.log")


def run_scenario(lab: Lab, workdir: Path, balancer: str, fault: str, *, rate: float = 200, duration_s: float = 12,
                 fault_at_s: float = 4, latency_ms: float = 50, hosts_used: tuple[str, ...] = HOSTS) -> dict:
    """balancer "none": the client talks to the first host directly (the single-host baseline)."""
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "host.toml"
    config.write_text(HOST_CONFIG.format(latency_ms=latency_ms, max_queue=4000 if fault != "overload" else 50))
    hosts = {h: lab.start_inferd(h, config, workdir / f"{h}.log") for h in hosts_used}
    lb_proc = None
    try:
        for h in hosts_used:
            lab.wait_http("client", f"http://{lab.target(lab.addresses[h])}:8000/readyz")
        if balancer == "none":
            lb_url = f"http://{lab.target(lab.addresses[hosts_used[0]])}:8000"
        else:
            lb_proc = start_balancer(lab, balancer, workdir)
            lb_url = f"http://{lab.target(lab.addresses['lb'])}:8080"
            lab.wait_http("client", f"{lb_url}/readyz")
            time.sleep(1.5)  # every host seen healthy by the balancer's checks
        out = workdir / "client.json"
        client = lab.start("client", [sys.executable, "-m", "tests.multihost.client", "--url", lb_url, "--rate",
                                      str(rate), "--duration", str(duration_s), "--timeout", "20", "--out", str(out)],
                           workdir / "client.log")
        time.sleep(min(fault_at_s, duration_s))
        fault_time = time.time()
        victim = hosts[hosts_used[0]]
        if fault in ("sigterm", "restart"):
            lab.signal(victim, signal.SIGTERM)
        elif fault == "sigkill":
            lab.signal(victim, signal.SIGKILL)
        elif fault == "link_down":
            lab.link("h1", up=False)
        elif fault == "sigstop":
            lab.signal(victim, signal.SIGSTOP)
        elif fault == "overload":  # a burst straight at host 1 alone, beside the balanced load
            lab.start("client", [sys.executable, "-m", "tests.multihost.client", "--url",
                                 f"http://{lab.target(lab.addresses['h1'])}:8000", "--rate", str(rate * 4),
                                 "--duration", "3", "--prefix", "burst", "--out", str(workdir / "burst.json")],
                      workdir / "burst.log")
        if fault == "restart":
            victim.wait(15)
            time.sleep(1.0)
            hosts["h1"] = lab.start_inferd("h1", config, workdir / "h1-restarted.log")
        client.wait(duration_s + 40)
        if fault == "link_down":
            lab.link("h1", up=True)
        elif fault == "sigstop":
            lab.signal(hosts["h1"], signal.SIGCONT)
        return analyse(json.loads(out.read_text()), workdir, fault_time, balancer, fault)
    finally:
        for proc in [lb_proc, *hosts.values()]:
            if proc is not None and proc.poll() is None:
                lab.signal(proc, signal.SIGTERM)
        for proc in [lb_proc, *hosts.values()]:
            if proc is not None:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    lab.signal(proc, signal.SIGKILL)
                    proc.wait(5)


def analyse(result: dict, workdir: Path, fault_time: float, balancer: str, fault: str) -> dict:
    records = result["records"]
    computed: dict[str, list[str]] = {}
    served_by_host: dict[str, int] = {}
    batches_by_host: dict[str, dict[int, int]] = {}
    for log in sorted(workdir.glob("h*.log")):
        host = log.stem.split("-")[0]
        for line in log.read_text(errors="replace").splitlines():
            if line.startswith("{") and '"status":200' in line:
                entry = json.loads(line)
                rid = entry["request_id"]
                if rid.startswith("mh-"):
                    computed.setdefault(rid, []).append(host)
                    served_by_host[host] = served_by_host.get(host, 0) + 1
                    batches_by_host.setdefault(log.stem, {})[entry.get("batch_id", 0)] = entry.get("batch_size", 0)
    ok = [r for r in records if r["status"] == 200]
    lost = [r for r in records if r["status"] == 0 or r.get("error") == "NOT_FROM_INFERD"
            or r["status"] not in (200, 503, 504, 500)]
    latencies = sorted(r["latency_s"] for r in ok)
    after = [r for r in records if r["sent_at"] + result["started_unix"] >= fault_time]
    to_h1_after = [rid for rid, hs in computed.items() if "h1" in hs]
    return {
        "balancer": balancer,
        "fault": fault,
        "sent": result["sent"],
        "answered_200": len(ok),
        "refused_503": sum(1 for r in records if r["status"] == 503),
        "lost": len(lost),
        "lost_examples": [(r["id"], r["status"], r.get("error"), r.get("detail")) for r in lost[:5]],
        "wrong": sum(1 for r in records if r["status"] == 200 and not r["right"]),
        "computed_twice": sum(1 for hs in computed.values() if len(hs) > 1),
        "p99_ms": round(latencies[int(len(latencies) * 0.99) - 1] * 1000, 1) if latencies else None,
        "sent_after_fault": len(after),
        "served_by_host": served_by_host,
        "mean_batch_by_host": {h: round(sum(b.values()) / len(b), 1) for h, b in batches_by_host.items() if b},
        "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1) if latencies else None,
        "requests_h1_served": len(to_h1_after),
    }
