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


ENVOY_ACCESS_LOG = """\
                access_log:
                  - name: envoy.access_loggers.stdout
                    filter:
                      or_filter:
                        filters:
                          - status_code_filter: { comparison: { op: GE, value: { default_value: 500, runtime_key: x } } }
                          - response_flag_filter: {}
                    typed_config:
                      "@type": type.googleapis.com/envoy.extensions.access_loggers.stream.v3.StdoutAccessLog
                      log_format:
                        text_format_source:
                          inline_string: "ENVOY %START_TIME(%s.%3f)% %REQ(X-REQUEST-ID)% %RESPONSE_CODE% %RESPONSE_FLAGS%
                            attempts=%UPSTREAM_REQUEST_ATTEMPT_COUNT% host=%UPSTREAM_HOST%
                            why=%UPSTREAM_TRANSPORT_FAILURE_REASON% details=%RESPONSE_CODE_DETAILS%\\n"
"""


def envoy_binary() -> str | None:
    beside = Path(sys.executable).with_name("envoy")
    if beside.exists():
        return str(beside)
    import shutil

    return shutil.which("envoy")


def start_balancer(lab: Lab, kind: str, workdir: Path) -> tuple[subprocess.Popen, str]:
    """The balancer, from the shipped file, and where to ask it about its hosts (for the watcher)."""
    lb = lab.addresses["lb"]
    hosts = [lab.target(lab.addresses[h]) for h in HOSTS]
    if kind == "haproxy":
        env = {"INFERD_LISTEN": f"{lb}:8080", **{f"INFERD_HOST{i + 1}": f"{a}:8000" for i, a in enumerate(hosts)}}
        stats_socket = workdir / "haproxy.sock"
        extra = workdir / "haproxy-stats.cfg"  # a second file: the shipped one runs unchanged
        extra.write_text(f"global\n    stats socket {stats_socket} mode 600\n")
        return lab.start("lb", ["haproxy", "-f", str(REPO / "deploy/haproxy/haproxy.cfg"), "-f", str(extra)],
                         workdir / "lb.log", env), str(stats_socket)
    config = (REPO / "deploy/envoy/envoy.yaml").read_text().replace("0.0.0.0", lb)
    for i, address in enumerate(hosts):
        config = config.replace(f"10.0.0.1{i + 1}", address)
    # One line per request that Envoy answered itself or had to retry: which hosts, why.
    config = config.replace("stat_prefix: inferd\n", "stat_prefix: inferd\n" + ENVOY_ACCESS_LOG, 1)
    rendered = workdir / "envoy.yaml"
    rendered.write_text(config)
    return lab.start("lb", [envoy_binary(), "-c", str(rendered), "--log-level", "warn", "--disable-hot-restart"],
                     workdir / "lb.log"), "127.0.0.1:9901"


def run_scenario(lab: Lab, workdir: Path, balancer: str, fault: str, *, rate: float = 200, duration_s: float = 12,
                 fault_at_s: float = 4, latency_ms: float = 50, hosts_used: tuple[str, ...] = HOSTS,
                 restore_after_s: float | None = None) -> dict:
    """balancer "none": the client talks to the first host directly (the single-host baseline).

    restore_after_s: bring a cut link up, or a stopped host back, this long after the fault (else only
    when the client is done), so that the time to rejoin can be measured.
    """
    workdir.mkdir(parents=True, exist_ok=True)
    config = workdir / "host.toml"
    config.write_text(HOST_CONFIG.format(latency_ms=latency_ms, max_queue=4000 if fault != "overload" else 50))
    hosts = {h: lab.start_inferd(h, config, workdir / f"{h}.log") for h in hosts_used}
    lb_proc = watcher = None
    try:
        for h in hosts_used:
            lab.wait_http("client", f"http://{lab.target(lab.addresses[h])}:8000/readyz")
        if balancer == "none":
            lb_url = f"http://{lab.target(lab.addresses[hosts_used[0]])}:8000"
        else:
            lb_proc, admin = start_balancer(lab, balancer, workdir)
            lb_url = f"http://{lab.target(lab.addresses['lb'])}:8080"
            lab.wait_http("client", f"{lb_url}/readyz")
            time.sleep(1.5)  # every host seen healthy by the balancer's checks
            watcher = lab.start("lb", [sys.executable, "-m", "tests.e2e.multihost.watch", "--balancer", balancer,
                                       "--admin", admin, "--host", f"{lab.target(lab.addresses['h1'])}:8000",
                                       "--duration", str(duration_s + 60), "--out", str(workdir / "watch.jsonl")],
                                workdir / "watch.log")
        out = workdir / "client.json"
        client = lab.start("client", [sys.executable, "-m", "tests.e2e.multihost.client", "--url", lb_url, "--rate",
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
            lab.start("client", [sys.executable, "-m", "tests.e2e.multihost.client", "--url",
                                 f"http://{lab.target(lab.addresses['h1'])}:8000", "--rate", str(rate * 4),
                                 "--duration", "3", "--prefix", "burst", "--out", str(workdir / "burst.json")],
                      workdir / "burst.log")
        if fault == "restart":
            victim.wait(15)
            time.sleep(1.0)
            hosts["h1"] = lab.start_inferd("h1", config, workdir / "h1-restarted.log")
        restore = {"link_down": lambda: lab.link("h1", up=True),
                   "sigstop": lambda: lab.signal(hosts["h1"], signal.SIGCONT)}.get(fault)
        if restore is not None and restore_after_s is not None:
            time.sleep(max(0.0, fault_time + restore_after_s - time.time()))
            restore()
            restore = None
        client.wait(duration_s + 40)
        if restore is not None:
            restore()
        return analyse(json.loads(out.read_text()), workdir, fault_time, balancer, fault)
    finally:
        for proc in [watcher, lb_proc, *hosts.values()]:
            if proc is not None and proc.poll() is None:
                lab.signal(proc, signal.SIGTERM)
        for proc in [watcher, lb_proc, *hosts.values()]:
            if proc is not None:
                try:
                    proc.wait(15)
                except subprocess.TimeoutExpired:
                    lab.signal(proc, signal.SIGKILL)
                    proc.wait(5)


def ejection_times(workdir: Path, fault_time: float) -> dict:
    """From the watcher's log: seconds from the fault until the balancer stopped routing to the host, and
    from the host being ready again (restarted, link up, resumed) until the balancer routes to it again."""
    path = workdir / "watch.jsonl"
    if not path.exists():
        return {"balancer_states": [], "eject_s": None, "ejected_as": None, "host_back_s": None, "rejoin_s": None}
    events = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    # A poll that could not reach the balancer says nothing about the host.
    after = [e for e in events if e["t"] >= fault_time and not e["state"].startswith("unreachable")]
    ejected = next((e for e in after if e["what"] == "balancer" and e["state"] != "up"), None)
    back = None
    if ejected is not None:
        lost_host = next((e for e in after if e["what"] == "host" and e["state"] != "ready"), None)
        if lost_host is not None:
            back = next((e for e in after if e["what"] == "host" and e["state"] == "ready" and e["t"] > lost_host["t"]),
                        None)
    rejoined = None
    if back is not None:
        # Its own 50 ms probe can see the host a moment after the balancer does: a rejoin time near 0.
        rejoined = next((e for e in after if e["what"] == "balancer" and e["state"] == "up" and e["t"] > ejected["t"]),
                        None)
    return {
        "balancer_states": sorted({e["state"] for e in after if e["what"] == "balancer"}),
        "eject_s": round(ejected["t"] - fault_time, 2) if ejected else None,
        "ejected_as": ejected["state"] if ejected else None,
        "host_back_s": round(back["t"] - fault_time, 2) if back else None,
        "rejoin_s": round(max(0.0, rejoined["t"] - back["t"]), 2) if rejoined else None,
    }


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
        "slow_over_2s": sum(1 for r in ok if r["latency_s"] > 2),
        **ejection_times(workdir, fault_time),
    }
