"""Results as JSON, a short markdown table, and plots (matplotlib, when installed)."""

from __future__ import annotations

import json
import math
import sys
import textwrap
from pathlib import Path
from typing import Any


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def markdown_table(steps: list[dict[str, Any]], ceiling_rps: float | None = None, floor_ms: float | None = None) -> str:
    labelled = any("variant" in s for s in steps)
    header = "| mode | offered | answered 200 req/s | p50 ms | p90 ms | p99 ms | p99.9 ms | max ms | errors | mean batch | CPU µs/req |"
    if labelled:
        header = "| variant " + header
    if ceiling_rps:
        header += " % of ceiling |"
    if floor_ms:
        header += " p50 over floor |"
    lines = [header, "|" + "---|" * (header.count("|") - 1)]
    for s in steps:
        lat, view = s["latency_ms"], s.get("server") or {}
        offered = f"{_fmt(s['offered'])} req/s" if s["mode"] == "open" else f"{s['offered']} clients"
        row = (
            (f"| {s.get('variant', '')} " if labelled else "")
            + f"| {s['mode']} | {offered} | {_fmt(s['ok_rps'])} | {_fmt(lat['p50'])} | {_fmt(lat['p90'])} | "
            f"{_fmt(lat['p99'])} | {_fmt(lat.get('p999'))} | {_fmt(lat['max'])} | {s['errors']} | "
            f"{_fmt(view.get('mean_batch_size'))} | {_fmt(view.get('cpu_us_per_request'))} |"
        )
        if ceiling_rps:
            row += f" {s['ok_rps'] / ceiling_rps * 100:.1f}% |"
        if floor_ms:
            row += f" +{lat['p50'] - floor_ms:.1f} ms |" if lat["p50"] is not None else " – |"
        lines.append(row)
    return "\n".join(lines) + "\n"


def write_results(
    out: str | Path,
    steps: list[dict[str, Any]],
    *,
    meta: dict[str, Any] | None = None,
    ceiling_rps: float | None = None,
    floor_ms: float | None = None,
    ideal: list[dict[str, float]] | None = None,
    plots: bool = True,
) -> dict[str, Any]:
    """Write OUT.json and OUT.md (and OUT_*.png). The JSON has every step under `steps`; a single step's
    figures are repeated at its top level (a sweep's are not: no step stands for the others)."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    doc: dict[str, Any] = {**(steps[0] if len(steps) == 1 else {}), "steps": steps, "meta": meta or {}}
    if ceiling_rps:
        doc["ceiling_rps"] = ceiling_rps
    if floor_ms:
        doc["floor_ms"] = floor_ms
    out.write_text(json.dumps(doc, indent=2) + "\n")
    title = (meta or {}).get("title", out.stem)
    out.with_suffix(".md").write_text(f"### {title}\n\n" + markdown_table(steps, ceiling_rps, floor_ms))
    if plots:
        plot(out, steps, title=title, ceiling_rps=ceiling_rps, floor_ms=floor_ms, ideal=ideal)
    return doc


def plot(
    out: Path,
    steps: list[dict[str, Any]],
    *,
    title: str,
    ceiling_rps: float | None,
    floor_ms: float | None,
    ideal: list[dict[str, float]] | None = None,
) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("plots skipped: matplotlib is not installed (pip install matplotlib, or 'inferd[bench]'; "
              "--no-plots to skip them quietly)", file=sys.stderr)
        return []
    written = []
    for mode in ("open", "closed"):
        chosen = [s for s in steps if s["mode"] == mode]
        if len(chosen) < 1:
            continue
        x = [s["offered"] for s in chosen]
        xlabel = "offered load (req/s, Poisson)" if mode == "open" else "closed-loop clients"
        fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
        for key, style in (("p50", "o-"), ("p90", "s--"), ("p99", "^-")):
            ax1.plot(x, [s["latency_ms"][key] for s in chosen], style, label=f"inferd {key}")
        if ideal and mode == "open":
            ax1.plot([p["rate"] for p in ideal], [p["p50"] for p in ideal], "k:", label="ideal server p50")
            ax1.plot([p["rate"] for p in ideal], [p["p99"] for p in ideal], "k-.", label="ideal server p99", alpha=0.6)
        if floor_ms:
            ax1.axhline(floor_ms, color="grey", lw=1, ls="--", label=f"floor {floor_ms:g} ms")
        if ceiling_rps and mode == "open":
            ax1.axvline(ceiling_rps, color="red", lw=1, ls="--", label=f"ceiling {ceiling_rps:g} req/s")
        ax1.set_xlabel(xlabel)
        ax1.set_ylabel("latency (ms)")
        ax1.set_title("latency vs load")
        ax1.grid(alpha=0.3)
        ax1.legend(fontsize=8)
        ax2.plot(x, [s["ok_rps"] for s in chosen], "o-", label="answered 200 (req/s)")
        if mode == "open":
            ax2.plot(x, x, color="grey", lw=1, ls=":", label="offered")
        if ceiling_rps:
            ax2.axhline(ceiling_rps, color="red", lw=1, ls="--", label=f"ceiling {ceiling_rps:g} req/s")
        ax2.set_xlabel(xlabel)
        ax2.set_ylabel("requests/s")
        ax2.set_ylim(bottom=0)
        ax2.set_title("throughput")
        ax2.grid(alpha=0.3)
        ax2.legend(fontsize=8)
        fig.suptitle("\n".join(textwrap.wrap(title, 100)), fontsize=11)  # a long title wraps, never runs off
        fig.tight_layout()
        path = out.with_name(f"{out.stem}_{mode}.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    with_sizes = [s for s in steps if (s.get("server") or {}).get("batch_sizes")]
    if with_sizes:
        fig, ax = plt.subplots(figsize=(7, 4))
        for s in with_sizes:
            sizes = {int(k): v for k, v in s["server"]["batch_sizes"].items()}
            xs = sorted(sizes)
            total = sum(sizes.values())
            label = f"{s['offered']} {'req/s' if s['mode'] == 'open' else 'clients'}"
            ax.step(xs, [sizes[k] / total for k in xs], where="mid", label=label)
        ax.set_xlabel("batch size")
        ax.set_ylabel("share of batches")
        ax.set_title("\n".join(textwrap.wrap(f"{title}: batch sizes", 60)), fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
        fig.tight_layout()
        path = out.with_name(f"{out.stem}_batches.png")
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    return written
