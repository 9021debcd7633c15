"""`inferd bench`: the command line's load test, from its parsed arguments to the table it prints
(and the files it writes with `--out`), with what it warns about (a load generator that ran late)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from urllib.parse import urlsplit

from .loadgen import LoadSpec
from .report import markdown_table, write_results
from .runner import run_sweep


def command(args: argparse.Namespace) -> int:
    """Run the sweep `args` describe, print its table (and write it with `--out`); 1 when nothing succeeded."""
    if args.body_file:
        with open(args.body_file, "rb") as f:
            body: bytes | None = f.read()
    else:
        body = args.body.encode() if args.body is not None else None
    headers = [("Content-Type", "application/json")] if body is not None else []
    for raw in args.header:
        name, _, value = raw.partition(":")
        headers.append((name.strip(), value.strip()))
    if args.stats_url == "none":
        stats_url = None
    elif args.stats_url:
        stats_url = args.stats_url
    else:
        parts = urlsplit(args.url)
        stats_url = f"{parts.scheme}://{parts.netloc}/v1/stats"
    spec = LoadSpec(
        url=args.url, body=body, method=args.method.upper(), headers=tuple(headers),
        duration_s=args.duration, timeout_s=args.timeout, processes=args.processes,
    )
    try:
        steps = run_sweep(
            spec,
            rates=[float(r) for r in args.rate.split(",")] if args.rate else None,
            concurrencies=[int(c) for c in args.concurrency.split(",")] if args.concurrency else None,
            engine=args.engine,
            stats_url=stats_url,
            warmup_s=args.warmup,
        )
    except (ValueError, RuntimeError) as exc:
        print(f"inferd bench: {exc}", file=sys.stderr)
        return 2
    if args.out:
        write_results(args.out, steps, meta={"url": args.url, "engine": args.engine},
                      ceiling_rps=args.ceiling_rps, floor_ms=args.floor_ms, plots=not args.no_plots)
    print(markdown_table(steps, args.ceiling_rps, args.floor_ms))
    if args.out:
        out = Path(args.out)
        written = [p for p in (out, out.with_suffix(".md"), *sorted(out.parent.glob(f"{out.stem}_*.png"))) if p.exists()]
        print("written: " + ", ".join(str(p) for p in written))
    else:
        print(json.dumps(steps[-1], indent=2))
    for step in steps:
        generator = step.get("generator")
        if generator is not None and generator["busy"]:
            print(f"inferd bench: the load generator itself ran late (its loop lag p99 {generator['loop_lag_ms']['p99']} ms "
                  f"at {step['offered']} {'req/s' if step['mode'] == 'open' else 'clients'}): part of what it measured is "
                  "its own; use more --processes or --engine wrk", file=sys.stderr)
    if not any(step["ok"] for step in steps):
        statuses: dict[str, int] = {}
        for step in steps:
            for status, n in step["statuses"].items():
                statuses[status] = statuses.get(status, 0) + n
        print(f"inferd bench: no request succeeded (answers by status: {statuses})", file=sys.stderr)
        return 1
    return 0
