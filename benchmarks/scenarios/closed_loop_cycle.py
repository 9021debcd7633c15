"""Where a closed-loop cycle goes at 100 clients: inferd beside Mosec 0.9.8, thread by thread.

At 100 closed-loop clients and batches of up to 100, every batch holds every client: one cycle is the
batch's own time plus the turnaround (its 100 answers written, the clients' next 100 requests read and
queued), and throughput is 100 requests per cycle. This measures, alternated round by round, S2 (10 ms
per batch), S1 (100 ms) and Mosec 0.9.8 running S2's worker, under wrk (2 processes, a distinct body
per request) sharing this machine's cores, and reads from /proc, per request, what each server thread
did: CPU (user, system), time on a CPU and time runnable but waiting for one (schedstat), involuntary
context switches. The turnaround is the cycle less the batch's time; what limits it is the busiest
thread's time on a CPU plus its waits for one.

    python closed_loop_cycle.py [--rounds N] [--quick] [--out-dir DIR]

Writes closed_loop_cycle.json / .md.
"""

from __future__ import annotations

import json
import os
import statistics
from pathlib import Path
from typing import Any

from common import (
    _machine,
    _stat_fields,
    inferd_server,
    listening_pid,
    mosec_server,
    own_option,
    parse_args,
    sim_config,
    step,
)
from request_path import S2_BODY

CLIENTS = 100
_TICK_S = 1 / os.sysconf("SC_CLK_TCK")  # (user and system times in /proc are in clock ticks)


def thread_times(pid: int) -> dict[tuple[int, int], dict[str, float]]:
    """Per thread of a process and its children: user and system CPU seconds, seconds on a CPU and
    seconds runnable but waiting (schedstat), involuntary context switches."""
    out: dict[tuple[int, int], dict[str, float]] = {}
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = list(Path(f"/proc/{p}/task").iterdir())
        except OSError:
            continue
        for task in tasks:
            try:
                fields = _stat_fields(task / "stat")
                run_ns, wait_ns = (int(x) for x in (task / "schedstat").read_text().split()[:2])
                status = dict(line.split(":", 1) for line in (task / "status").read_text().splitlines() if ":" in line)
                todo += [int(c) for c in (task / "children").read_text().split()]
            except (OSError, ValueError):
                continue
            out[(p, int(task.name))] = {
                "user_s": int(fields[11]) * _TICK_S, "sys_s": int(fields[12]) * _TICK_S, "run_s": run_ns / 1e9,
                "wait_s": wait_ns / 1e9, "involuntary": int(status["nonvoluntary_ctxt_switches"]), "name": (task / "comm").read_text().strip(),
            }
    return out


def measured(url: str, pid: int, path: str, batch_ms: float, quick: bool, body: bytes = S2_BODY,
             duration_s: float = 10) -> dict[str, Any]:
    """One 100-client step (after a warm-up step), with every server thread's share per request (`loop`:
    the thread of the process `pid` itself, inferd's event loop)."""
    step(url, clients=CLIENTS, duration_s=2, warmup_s=0, quick=quick, path=path, stats_path=None, body=body, processes=2)
    before = thread_times(pid)
    result = step(url, clients=CLIENTS, duration_s=duration_s, warmup_s=0, quick=quick, path=path, stats_path=None,
                  body=body, processes=2)
    after = thread_times(pid)
    n = max(1, result["completed"])
    threads = []
    for key, end in after.items():
        start = before.get(key)
        if start is None:
            continue
        share = {k: round((end[k] - start[k]) / n * 1e6, 1) for k in ("user_s", "sys_s", "run_s", "wait_s")}
        share["involuntary"] = round((end["involuntary"] - start["involuntary"]) / n, 3)
        if share["run_s"] >= 0.5:  # (threads that did something per request)
            threads.append({"thread": end["name"], "loop": key[1] == pid,
                            **{k.replace("_s", "_us"): v for k, v in share.items()}})
    threads.sort(key=lambda t: -t["run_us"])
    rps = result["achieved_rps"]
    cycle_ms = CLIENTS / rps * 1000 if rps else None
    return {"rps": rps, "cycle_ms": round(cycle_ms, 2) if cycle_ms else None,
            "turnaround_ms": round(cycle_ms - batch_ms, 2) if cycle_ms else None, "threads": threads,
            "cpu_us": round(sum(t["user_us"] + t["sys_us"] for t in threads), 1)}


def table(rounds: list[dict[str, dict[str, Any]]]) -> list[str]:
    lines = ["| server | req/s | cycle ms | turnaround ms | server CPU µs/req | busiest thread: on a CPU µs/req (user + system) | "
             "waiting for a CPU µs/req | involuntary switches/req | other threads on a CPU µs/req |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name in rounds[0]:
        runs = [r[name] for r in rounds]
        med = lambda f: statistics.median(f(x) for x in runs)  # noqa: E731
        top = lambda x: x["threads"][0]  # noqa: E731
        lines.append(
            f"| {name} | {med(lambda x: x['rps']):,.0f} | {med(lambda x: x['cycle_ms']):.2f} | "
            f"{med(lambda x: x['turnaround_ms']):.2f} | {med(lambda x: x['cpu_us']):.1f} | "
            f"{med(lambda x: top(x)['run_us']):.1f} ({med(lambda x: top(x)['user_us']):.0f} + {med(lambda x: top(x)['sys_us']):.0f}) | "
            f"{med(lambda x: top(x)['wait_us']):.1f} | {med(lambda x: top(x)['involuntary']):.3f} | "
            f"{' / '.join(f'{t:.1f}' for t in _others(runs))} |")
    return lines


def _others(runs: list[dict[str, Any]]) -> list[float]:
    """The median time on a CPU per request of the second, third... busiest threads."""
    width = min(len(x["threads"]) for x in runs)
    return [statistics.median(x["threads"][i]["run_us"] for x in runs) for i in range(1, min(width, 4))]


if __name__ == "__main__":
    n_rounds = int(own_option("--rounds") or 3)
    args = parse_args(__doc__)
    rounds: list[dict[str, dict[str, Any]]] = []
    with mosec_server(args.quick) as mosec:
        for _ in range(1 if args.quick else n_rounds):
            this: dict[str, dict[str, Any]] = {}
            for name, batch_ms in (("inferd S2 (10 ms)", 10.0), ("inferd S1 (100 ms)", 100.0)):
                with inferd_server(sim_config(latency_ms=batch_ms)) as url:
                    this[name] = measured(url, listening_pid(url), "/v1/inference", batch_ms, args.quick)
            if mosec is not None:
                this["Mosec 0.9.8 S2 (10 ms)"] = measured(mosec[0], mosec[1], "/inference", 10.0, args.quick)
            rounds.append(this)
            print({k: (v["rps"], v["turnaround_ms"]) for k, v in this.items()}, flush=True)
    lines = [f"### A closed-loop cycle at {CLIENTS} clients, thread by thread (medians of {len(rounds)} alternated rounds; "
             f"{_machine()})", "", *table(rounds)]
    out = Path(args.out_dir)
    (out / "closed_loop_cycle.json").write_text(json.dumps({"clients": CLIENTS, "rounds": rounds, "note": __doc__},
                                                           indent=1) + "\n")
    (out / "closed_loop_cycle.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
