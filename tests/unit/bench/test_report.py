"""The bench's report: plots are written where matplotlib is, and their absence is said, not silent."""

from __future__ import annotations

import sys

from inferd.bench.report import plot


def test_plots_skipped_for_want_of_matplotlib_say_so(tmp_path, monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # (an import of it raises ImportError)
    steps = [{"mode": "closed", "offered": 10, "ok_rps": 9.5, "latency_ms": {"p50": 1.0, "p90": 2.0, "p99": 3.0}}]
    assert plot(tmp_path / "r.json", steps, title="t", ceiling_rps=None, floor_ms=None) == []
    assert "plots skipped: matplotlib is not installed" in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
