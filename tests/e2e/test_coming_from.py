"""The page for users of TEI, vLLM, Infinity and Triton (`docs/coming-from.md`), row by row: each flag in
its inferd column is one `inferd serve` takes, each refused one is refused saying where to go; each
route it names is one the server answers (and each "not served" one it does not); each metric is one
`/metrics` writes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from inferd.cli import main
from inferd.config import ModelConfig

from ..helpers import running_server, sim_model

PAGE = Path(__file__).resolve().parents[2] / "docs" / "coming-from.md"
ROUTE = re.compile(r"`(GET|POST) (/[^`\s]*)`")


def tables() -> dict[str, list[tuple[str, str]]]:
    """Rows (theirs, inferd) of the page's tables, by what they map: flag, route or metric."""
    found: dict[str, list[tuple[str, str]]] = {"flag": [], "route": [], "metric": []}
    kind = None
    for line in PAGE.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")] if line.startswith("|") else []
        if len(cells) != 2 or set(cells[0]) <= {"-"}:
            continue
        if cells[1] == "inferd":  # a table's header: "TEI's flag", "vLLM's route", "Triton's setting", ...
            kind = next((k for k in ("route", "metric") if cells[0].endswith(k)), "flag")
            continue
        if kind is not None:
            found[kind].append((cells[0], cells[1]))
    return found


def test_the_page_has_every_ecosystem_and_its_three_tables():
    rows = tables()
    assert len(rows["flag"]) >= 30 and len(rows["route"]) >= 20 and len(rows["metric"]) >= 12
    text = PAGE.read_text()
    assert all(f"## {name}" in text for name in ("Text Embeddings Inference", "vLLM", "Infinity", "Triton"))


def test_every_flag_is_taken_or_refused_with_where_to_go(capsys, tmp_path):
    with pytest.raises(SystemExit):
        main(["serve", "--help"])
    taken = capsys.readouterr().out
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    for theirs, ours in tables()["flag"]:
        if ours.startswith("refused"):
            flag = re.search(r"`(--[a-z-]+)", theirs)
            assert flag is not None, theirs
            with pytest.raises(SystemExit) as exited:
                main(["serve", str(folder), flag.group(1), "x"])
            said = capsys.readouterr().err
            assert exited.value.code == 2 and f"unrecognized argument {flag.group(1)}" in said and "in inferd," in said
            continue
        for flag in re.findall(r"(?<![\w-])(--[a-z][a-z-]+)", ours):
            assert re.search(rf"(?<![\w-]){flag}\b", taken), f"{flag} ({theirs}) is not an `inferd serve` flag"


async def test_every_route_is_answered_and_every_metric_written(http):
    echo = ModelConfig(name="echo", kind="generation", backend="inferd.backends.echo_engine", options={"step_ms": 1})
    async with running_server(sim_model("sim", latency_ms=1), echo) as srv:
        for theirs, ours in tables()["route"]:
            for method, path in ROUTE.findall(theirs if ours == "not served" else ours):
                async with http.request(method, srv.url + path.replace("{model}", "sim"), json={}) as resp:
                    body = await resp.text()
                routed = not (resp.status == 404 and "no route" in body)
                assert routed == (ours != "not served"), (method, path, resp.status, body[:200])
        await http.post(f"{srv.url}/v1/inference", json={"input": "count me", "model": "sim"})
        async with http.get(f"{srv.url}/metrics") as resp:
            written = await resp.text()
    for theirs, ours in tables()["metric"]:
        for name in re.findall(r"`(inferd_[a-z_]+)`", ours):
            assert re.search(rf"^# TYPE {name}(_total)? ", written, re.M), f"{name} ({theirs}) is not in /metrics"
