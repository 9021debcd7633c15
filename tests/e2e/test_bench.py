"""`inferd bench` against the real server: the result file, honest open-loop latency, error accounting."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys

import pytest

from inferd.bench.runner import percentile

from ..helpers import backend_of, running_server, sim_model


async def bench(*args: str) -> tuple[int, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "inferd", "bench", *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
    )
    out, _ = await asyncio.wait_for(proc.communicate(), timeout=120)
    return proc.returncode, out.decode()


@pytest.fixture
def body_file(tmp_path):
    path = tmp_path / "body.json"
    path.write_text('{"input": "bench-{i}"}')
    return path


async def test_open_loop_result_file_has_the_contract_fields(tmp_path, body_file):
    async with running_server(sim_model(latency_ms=20, max_batch_size=32)) as srv:
        out = tmp_path / "result.json"
        code, text = await bench("--url", f"{srv.url}/v1/inference", "--body-file", str(body_file),
                                 "--rate", "100", "--duration", "2", "--out", str(out))
        assert code == 0, text
        result = json.loads(out.read_text())
        assert result["sent"] > 100 and result["errors"] == 0
        assert result["completed"] == result["sent"]
        assert 60 < result["achieved_rps"] < 140
        assert {"p50", "p90", "p99", "max"} <= set(result["latency_ms"])
        assert 20 <= result["latency_ms"]["p50"] <= result["latency_ms"]["p99"] <= result["latency_ms"]["max"]
        assert result["server"]["mean_batch_size"] >= 1 and result["server"]["cpu_s_per_1000_requests"] > 0
        assert len(result["generator"]["loop_lag_ms"]) == 3  # its own loop, measured beside the server
        computed = backend_of(srv).computed
        assert computed["bench-0"] == 1 and computed["bench-1"] == 1  # {i} made every input distinct
        assert (tmp_path / "result.md").read_text().count("| open |") == 1


async def test_a_sweeps_result_keeps_each_steps_own_server_view(tmp_path, body_file):
    async with running_server(sim_model(latency_ms=10, max_batch_size=32)) as srv:
        out = tmp_path / "sweep.json"
        code, text = await bench("--url", f"{srv.url}/v1/inference", "--body-file", str(body_file),
                                 "--rate", "40,80", "--duration", "1", "--out", str(out), "--no-plots")
        assert code == 0, text
    result = json.loads(out.read_text())
    assert [s["offered_rps"] for s in result["steps"]] == [40, 80] and "server" not in result  # no step stands for all
    assert all(s["server"]["batches"] > 0 for s in result["steps"])


async def test_closed_loop_keeps_n_clients_busy(tmp_path, body_file):
    async with running_server(sim_model(latency_ms=50, max_batch_size=8, max_wait_ms=2)) as srv:
        out = tmp_path / "closed.json"
        code, text = await bench("--url", f"{srv.url}/v1/inference", "--body-file", str(body_file),
                                 "--concurrency", "8", "--duration", "2", "--out", str(out), "--no-plots")
        assert code == 0, text
        result = json.loads(out.read_text())
        assert result["mode"] == "closed" and result["errors"] == 0
        # 8 clients against 50 ms batches of up to 8: about 8 / 0.05 = 160 req/s at most
        assert 50 < result["achieved_rps"] <= 175
        assert result["server"]["mean_batch_size"] > 2


async def test_open_loop_latency_counts_from_the_scheduled_send(tmp_path, body_file):
    """A server that falls behind cannot hide its queue: latency includes the wait to be sent."""
    async with running_server(sim_model(latency_ms=20, max_batch_size=1, max_wait_ms=0)) as srv:
        out = tmp_path / "co.json"
        code, text = await bench("--url", f"{srv.url}/v1/inference", "--body-file", str(body_file),
                                 "--rate", "100", "--duration", "1", "--out", str(out), "--no-plots")
        assert code == 0, text
        result = json.loads(out.read_text())
        # ~100 requests against 50 req/s of capacity: the last ones wait about a second.
        assert result["latency_ms"]["p99"] > 500
        assert result["latency_ms"]["p50"] > 100


async def test_refusals_are_counted_by_status_and_error_code(tmp_path, body_file):
    model = sim_model(latency_ms=100, max_batch_size=1, max_wait_ms=0, max_queue=2)
    async with running_server(model) as srv:
        out = tmp_path / "shed.json"
        code, text = await bench("--url", f"{srv.url}/v1/inference", "--body-file", str(body_file),
                                 "--rate", "200", "--duration", "1", "--out", str(out), "--no-plots")
        assert code == 0, text
        result = json.loads(out.read_text())
        assert result["statuses"]["503"] == result["error_codes"]["SERVICE_OVERLOADED"] > 50
        assert result["errors"] == result["statuses"]["503"]
        assert sum(result["statuses"].values()) == result["sent"]


@pytest.mark.skipif(shutil.which("wrk") is None, reason="wrk is not installed (apt-get install wrk)")
async def test_wrk_engine_counts_statuses(tmp_path, body_file):
    async with running_server(sim_model(latency_ms=10, max_batch_size=64)) as srv:
        out = tmp_path / "wrk.json"
        code, text = await bench("--url", f"{srv.url}/v1/inference", "--body-file", str(body_file),
                                 "--concurrency", "16", "--duration", "2", "--engine", "wrk",
                                 "--out", str(out), "--no-plots")
        assert code == 0, text
        result = json.loads(out.read_text())
        assert result["engine"] == "wrk" and result["statuses"]["200"] == result["sent"] > 100
        assert computed_distinct(backend_of(srv).computed) > 100


def computed_distinct(counter) -> int:
    return sum(1 for key in counter if key.startswith("bench-"))


def test_percentile_is_nearest_rank():
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50.0
    assert percentile(values, 99) == 99.0
    assert percentile(values, 100) == 100.0
    assert percentile([5.0], 99.9) == 5.0


async def test_warm_up_opens_the_connections_the_measured_part_uses(tmp_path, body_file):
    async with running_server(sim_model(latency_ms=10, max_batch_size=64)) as srv:
        cold, warm = tmp_path / "cold.json", tmp_path / "warm.json"
        for out, warmup in ((cold, "0"), (warm, "1")):
            code, text = await bench("--url", f"{srv.url}/v1/inference", "--body-file", str(body_file),
                                     "--concurrency", "32", "--duration", "1", "--warmup", warmup,
                                     "--out", str(out), "--no-plots")
            assert code == 0, text
        cold_result, warm_result = json.loads(cold.read_text()), json.loads(warm.read_text())
    # Cold: every client opened its connection inside the measured part; that time is reported apart.
    assert cold_result["connect_ms"]["count"] == 32 and cold_result["connect_ms"]["max"] >= 0
    # Warm: the connections were opened during the warm-up and reused.
    assert warm_result["connect_ms"] is None
    assert warm_result["errors"] == 0 and warm_result["server"]["mean_batch_size"] >= 1


async def test_connection_failures_are_counted_apart_from_latency(tmp_path, body_file):
    import socket

    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "refused.json"
    code, text = await bench("--url", f"http://127.0.0.1:{port}/v1/inference", "--body-file", str(body_file),
                             "--rate", "50", "--duration", "1", "--stats-url", "none", "--out", str(out), "--no-plots")
    assert code == 1 and "no request succeeded" in text, text  # total failure is not a success
    assert f"written: {out}" in text
    result = json.loads(out.read_text())  # valid JSON: no NaN where there is no latency
    assert result["connect_errors"] == result["statuses"]["connect_error"] == result["sent"] > 20
    assert result["completed"] == 0 and result["server"] is None and result["latency_ms"]["p50"] is None


async def test_without_out_the_last_step_is_printed_as_valid_json_and_all_404_fails(tmp_path, body_file):
    async with running_server(sim_model(latency_ms=5)) as srv:
        code, text = await bench("--url", f"{srv.url}/v1/inference", "--body", '{"input": "x", "model": "nope"}',
                                 "--concurrency", "2", "--duration", "0.5")
    assert code == 1, text
    printed, _ = json.JSONDecoder().raw_decode(text, text.index("{\n"))
    assert printed["ok"] == 0 and printed["statuses"] == {"404": printed["completed"]}


async def test_a_server_whose_stats_are_not_inferds_is_measured_without_the_server_view(tmp_path, body_file):
    from aiohttp import web

    async def anything(request: web.BaseRequest) -> web.Response:
        await request.read()
        return web.json_response({"ok": True, "path": request.path})  # a catch-all: /v1/stats too

    runner = web.ServerRunner(web.Server(anything))
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        out = tmp_path / "other.json"
        code, text = await bench("--url", f"http://127.0.0.1:{port}/predict", "--body-file", str(body_file),
                                 "--concurrency", "4", "--duration", "1", "--out", str(out), "--no-plots")
    finally:
        await runner.cleanup()
    assert code == 0, text
    result = json.loads(out.read_text())
    assert result["statuses"]["200"] == result["sent"] > 10 and result["server"] is None
