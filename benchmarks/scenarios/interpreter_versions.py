"""Whether a newer CPython makes the request path cheaper: the same inferd, the same versions of its
request-path dependencies, run by this venv's interpreter and by others (e.g. 3.12, 3.13), alternated.

Why measure it: every request runs ~2,900 bytecodes and ~90 Python calls of inferd's own on the event
loop (issue 27), so the interpreter's cost per bytecode and per call is much of a request's CPU; an
upgrade would be the cheapest cut there is, if it were one. Two measures:
- instructions per request in-process (`inprocess_request.py`'s drive under callgrind: the real server,
  100 connections, full batches), the precise one;
- S2 at 100 closed-loop clients (10 ms batches, distinct bodies, wrk): req/s and the event loop's user
  and system CPU per request, the noisy one.

    python interpreter_versions.py --python /path/to/python3.12 [--python ...] [--rounds N] [--repeats R]
                                   [--wall-rounds W] [--out-dir DIR]

Each other interpreter gets a venv in benchmarks/.interpreters/<version> on first use, with this venv's
versions of aiohttp, uvloop, orjson and the rest of what the request path imports (torch is not needed:
the simulated GPU serves). Writes interpreter_versions.json / .md.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

from closed_loop_cycle import measured
from common import REPO, RESULTS, inferd_server, listening_pid, sim_config
from inprocess_request import instructions_per_request

# What the server imports to serve the simulated GPU, and what aiohttp imports: pinned to this venv's versions.
REQUEST_PATH_PACKAGES = (
    "aiohttp", "uvloop", "orjson", "prometheus-client", "numpy", "xxhash", "multidict", "yarl", "propcache",
    "frozenlist", "aiosignal", "attrs", "aiohappyeyeballs", "idna",
)
VENVS = REPO / "benchmarks" / ".interpreters"


def interpreter_version(python: str) -> str:
    return subprocess.run([python, "-c", "import platform; print(platform.python_version())"], capture_output=True,
                          text=True, check=True).stdout.strip()


def venv_for(base: str) -> str:
    """The python of a venv made from the interpreter `base`, holding this venv's request-path packages."""
    home = VENVS / interpreter_version(base)
    python = home / "bin" / "python"
    if not (home / ".installed").exists():
        subprocess.run([base, "-m", "venv", "--clear", str(home)], check=True)
        pins = [f"{name}=={version(name)}" for name in REQUEST_PATH_PACKAGES]
        subprocess.run([str(python), "-m", "pip", "install", "--quiet", *pins], check=True, stderr=subprocess.DEVNULL)
        (home / ".installed").write_text("\n".join(pins) + "\n")
    return str(python)


def s2_at_100(python: str) -> tuple[float, float, float]:
    """req/s, and the event loop thread's user and system µs per request, over 8 s after a 2 s warm-up."""
    with inferd_server(sim_config(latency_ms=10), python=python) as url:
        result = measured(url, listening_pid(url), "/v1/inference", 10.0, False, duration_s=8)
    loop = next(thread for thread in result["threads"] if thread["loop"])
    return round(result["rps"]), loop["user_us"], loop["sys_us"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", required=True, help="another interpreter (repeatable)")
    parser.add_argument("--rounds", type=int, default=40, help="rounds of 100 requests counted (default 40)")
    parser.add_argument("--repeats", type=int, default=2, help="alternations of the callgrind counts (default 2)")
    parser.add_argument("--wall-rounds", type=int, default=3, help="alternations of S2 @100 (default 3; 0: none)")
    parser.add_argument("--out-dir", type=Path, default=RESULTS)
    args = parser.parse_args()
    pythons = {sys.version.split()[0]: sys.executable}
    for base in args.python:
        pythons[interpreter_version(base)] = venv_for(base)
    counts: dict[str, list[int]] = {name: [] for name in pythons}
    for _ in range(args.repeats):
        for name, python in pythons.items():
            counts[name].append(round(instructions_per_request(args.rounds, True, REPO, python)))
            print(name, "instructions", counts[name][-1], flush=True)
    wall: dict[str, list[tuple[float, float, float]]] = {name: [] for name in pythons}
    for _ in range(args.wall_rounds):
        for name, python in pythons.items():
            wall[name].append(s2_at_100(python))
            print(name, "S2 @100 (req/s, loop user µs, sys µs)", wall[name][-1], flush=True)
    this = sys.version.split()[0]
    median = {name: statistics.median(xs) for name, xs in counts.items()}
    rows = []
    for name in pythons:
        runs = wall[name]
        rps, user, system = ((statistics.median(r[i] for r in runs) for i in range(3)) if runs else (None,) * 3)
        rows.append({"python": name, "instructions": counts[name], "median_instructions": median[name],
                     "over_this": round(median[name] / median[this], 4), "s2_100_runs": runs, "s2_100_rps": rps,
                     "loop_user_us": user, "loop_sys_us": system})
    args.out_dir.mkdir(parents=True, exist_ok=True)
    (args.out_dir / "interpreter_versions.json").write_text(json.dumps(
        {"rounds": args.rounds, "packages": {name: version(name) for name in REQUEST_PATH_PACKAGES}, "rows": rows,
         "note": __doc__}, indent=1) + "\n")
    lines = [f"### The request path by interpreter (callgrind in-process, {args.rounds} rounds of 100, {args.repeats} "
             f"alternated runs; S2 @100 clients, {args.wall_rounds} alternated rounds, medians)", "",
             "| Python | instructions per request | median | ÷ " + this + " | S2 @100 req/s | loop user µs/req | "
             "loop system µs/req |", "|---|---|---|---|---|---|---|"]
    for row in rows:
        wall_cells = (f"{row['s2_100_rps']:,.0f} | {row['loop_user_us']} | {row['loop_sys_us']}" if row["s2_100_runs"]
                      else "- | - | -")
        lines.append(f"| {row['python']} | {' / '.join(f'{v:,}' for v in row['instructions'])} | "
                     f"{row['median_instructions']:,.0f} | {row['over_this']:.3f} | {wall_cells} |")
    (args.out_dir / "interpreter_versions.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
