"""GET /metrics: exact counts after known traffic, valid exposition, a real Prometheus scraping it."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import shutil
import socket
import subprocess
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families

from ..helpers import infer, running_server, sim_model, until


async def scrape(http, url: str) -> dict[str, list]:
    async with http.get(f"{url}/metrics") as resp:
        assert resp.status == 200
        assert resp.headers["Content-Type"].startswith("text/plain")
        text = await resp.text()
    families = {f.name: f.samples for f in text_string_to_metric_families(text)}
    families["__text__"] = text  # type: ignore[assignment]
    return families


def value(families: dict, sample_name: str, **labels: str) -> float:
    family = sample_name.removesuffix("_total").removesuffix("_count").removesuffix("_sum").removesuffix("_bucket")
    matches = [s.value for s in families[family] if s.name == sample_name and all(s.labels.get(k) == v for k, v in labels.items())]
    assert len(matches) == 1, (sample_name, labels, families[family])
    return matches[0]


async def test_counters_and_histograms_match_the_traffic_exactly(http):
    async with running_server(sim_model(latency_ms=20, max_batch_size=16, max_wait_ms=5)) as srv:
        ok = await asyncio.gather(*(infer(http, srv.url, {"input": f"m{i}"}) for i in range(50)))
        bad = await asyncio.gather(*(infer(http, srv.url, b"nope") for _ in range(3)))
        missing = await infer(http, srv.url, {"input": "x", "model": "ghost"})
        assert [s for s, _, _ in ok] == [200] * 50 and [s for s, _, _ in bad] == [400] * 3 and missing[0] == 404
        f = await scrape(http, srv.url)
        assert value(f, "inferd_requests_total", model="m", code="200", error="") == 50
        assert value(f, "inferd_requests_total", model="-", code="400", error="INVALID_INPUT") == 3
        assert value(f, "inferd_requests_total", model="-", code="404", error="MODEL_NOT_FOUND") == 1
        assert value(f, "inferd_request_duration_seconds_count", model="m") == 50
        assert value(f, "inferd_queue_wait_seconds_count", model="m") == 50
        assert value(f, "inferd_admission_seconds_count", model="m") == 50
        assert value(f, "inferd_response_seconds_count", model="m") == 50
        batches = srv.models["m"].stats.batches
        assert value(f, "inferd_compute_seconds_count", model="m") == batches
        assert value(f, "inferd_batch_size_count", model="m") == batches
        assert value(f, "inferd_batch_size_sum", model="m") == 50
        assert sum(s.value for s in f["inferd_batches"] if s.name == "inferd_batches_total") == batches
        assert value(f, "inferd_request_duration_seconds_bucket", model="m", le="+Inf") == 50
        assert value(f, "inferd_queue_depth", model="m", tier="default") == 0
        assert value(f, "inferd_workers_healthy", model="m") == 1
        assert value(f, "inferd_capacity_requests_per_second", model="m") > 0
        for name in ("inferd_requests_waiting", "inferd_requests_running", "inferd_predicted_wait_max_seconds"):
            (sample,) = f[name]
            assert sample.labels == {}  # pod totals: one series, no labels


async def test_pod_totals_are_served_at_once_while_a_worker_is_stuck_in_a_long_call(http):
    """Routers scrape the pod totals every 50 ms: a scrape must never wait for a worker."""
    model = sim_model(latency_ms=1500, max_batch_size=8, max_wait_ms=5)
    async with running_server(model) as srv:
        running = asyncio.gather(*(infer(http, srv.url, {"input": f"slow{i}"}) for i in range(8)))
        served = srv.models["m"]
        await until(lambda: served.workers[0].current is not None and len(served.workers[0].current.requests) == 8)
        queued = asyncio.gather(*(infer(http, srv.url, {"input": f"next{i}"}) for i in range(3)))
        await until(lambda: served.batcher.depth == 3)
        for _ in range(5):
            started = time.monotonic()
            f = await scrape(http, srv.url)
            assert time.monotonic() - started < 0.5
            assert value(f, "inferd_requests_running") == 8
            assert value(f, "inferd_requests_waiting") == 3
            assert value(f, "inferd_predicted_wait_max_seconds") > 0.5  # the running call has ~1 s left
        assert all(status == 200 for status, _, _ in await running + await queued)


async def test_shed_and_expired_requests_are_counted(http):
    model = sim_model(latency_ms=200, max_batch_size=1, max_wait_ms=0, max_queue=1)
    async with running_server(model) as srv:
        results = await asyncio.gather(
            *(infer(http, srv.url, {"input": f"s{i}", "timeout_ms": 300}) for i in range(6))
        )
        statuses = sorted(s for s, _, _ in results)
        f = await scrape(http, srv.url)
        overload_reasons = {"queue_full", "deadline_infeasible", "tier_predicted_wait"}
        refused = sum(s.value for s in f["inferd_refused"] if s.labels.get("reason") in overload_reasons)
        assert refused == statuses.count(503) > 0
        assert not f.get("inferd_shed")  # (one tier, one tenant: nothing is evicted for anyone)
        expired = sum(s.value for s in f["inferd_expired"] if s.labels.get("where") in ("queued", "computing"))
        assert expired == statuses.count(504)


async def test_busy_ratio_reflects_load(http):
    async with running_server(sim_model(latency_ms=50, max_batch_size=4, max_wait_ms=0)) as srv:
        for _ in range(3):
            await asyncio.gather(*(infer(http, srv.url, {"input": f"b{i}"}) for i in range(8)))
        model = srv.models["m"]
        model.pool.sample_busy(time.monotonic())
        f = await scrape(http, srv.url)
        ratio = value(f, "inferd_worker_busy_ratio", model="m", worker="m-0")
        assert 0.1 < ratio <= 1.0


async def test_server_timing_fits_inside_the_latency_and_request_id_round_trips(http):
    async with running_server(sim_model(latency_ms=30, max_batch_size=8)) as srv:
        results = await asyncio.gather(
            *(infer(http, srv.url, {"input": f"t{i}"}, headers={"X-Request-ID": f"trace-{i}"}) for i in range(20))
        )
        for i, (status, body, headers) in enumerate(results):
            assert status == 200 and headers["X-Request-ID"] == body["request_id"] == f"trace-{i}"
            timing = dict(part.strip().split(";dur=") for part in headers["Server-Timing"].split(","))
            assert float(timing["compute"]) >= 25
            assert float(timing["queue"]) + float(timing["compute"]) <= body["latency_ms"]


async def test_access_log_lines_are_json_and_sampled(http, caplog):
    with caplog.at_level(logging.DEBUG, logger="inferd.access"):
        async with running_server(sim_model(), access_log_sample_rate=1.0) as srv:
            await infer(http, srv.url, {"input": "logged"}, headers={"X-Request-ID": "log-me"})
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "inferd.access"]
    (line,) = [x for x in lines if x["request_id"] == "log-me"]
    assert line["status"] == 200 and line["model"] == "m" and line["batch_size"] >= 1
    assert {"batch_id", "queue_ms", "compute_ms", "latency_ms", "tier"} <= set(line)
    caplog.clear()
    faulty = sim_model(backend="inferd.backends.faulty:create", options={"fail_marker": "BAD"})
    with caplog.at_level(logging.DEBUG, logger="inferd.access"):
        async with running_server(faulty, access_log_sample_rate=0.0) as srv:
            await infer(http, srv.url, {"input": "fine"})
            await infer(http, srv.url, {"input": "BAD one"})
        lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "inferd.access"]
    assert [x["status"] for x in lines] == [500]  # unsampled, but a 500 is always logged


async def test_metrics_can_be_switched_off(http):
    async with running_server(metrics=False) as srv:
        async with http.get(f"{srv.url}/metrics") as resp:
            assert resp.status == 404
        assert (await infer(http, srv.url, {"input": "x"}))[0] == 200


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package 'prometheus'; .ci/run installs it)")
async def test_promtool_accepts_the_exposition(http):
    async with running_server(sim_model(max_batch_size=8)) as srv:
        await asyncio.gather(*(infer(http, srv.url, {"input": f"p{i}"}) for i in range(10)))
        text = (await scrape(http, srv.url))["__text__"]
    proc = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip() == "" and proc.stderr.strip() == "", proc.stdout + proc.stderr  # no lint warnings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus not installed (Debian package 'prometheus'; .ci/run installs it)")
async def test_a_real_prometheus_scrapes_and_computes_the_request_rate(http, tmp_path):
    async with running_server(sim_model(latency_ms=10, max_batch_size=16)) as srv:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n"
            "scrape_configs:\n  - job_name: inferd\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{srv.port}']\n"
        )
        prom = subprocess.Popen(
            ["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
             f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        try:
            sent = iter(range(10**6))

            async def prometheus_sees_a_rate() -> bool:
                i = next(sent)
                await asyncio.gather(*(infer(http, srv.url, {"input": f"r{i}-{j}"}) for j in range(20)))
                try:
                    async with http.get(
                        f"http://127.0.0.1:{port}/api/v1/query",
                        params={"query": 'sum(rate(inferd_requests_total{code="200"}[10s]))'},
                    ) as resp:
                        result = (await resp.json())["data"]["result"]
                    return bool(result) and float(result[0]["value"][1]) > 0
                except Exception:  # noqa: BLE001 - prometheus still starting
                    return False

            await until(prometheus_sees_a_rate, timeout_s=40, step_s=0.5)  # (Prometheus computes a request rate)
        finally:
            prom.terminate()
            prom.wait(10)


@pytest.mark.skipif(shutil.which("prometheus") is None,
                    reason="prometheus not installed (Debian package 'prometheus'; .ci/run installs it)")
async def test_every_panel_of_the_grafana_dashboard_has_data_from_a_live_server(http, tmp_path):
    """deploy/grafana/inferd.json against a real Prometheus scraping a server under load (a model with a
    latency objective and a variable cost; some requests refused, some failing): each batch panel's query
    returns series; the generation panels' queries are valid PromQL (no generation model runs here)."""
    from ..helpers import REPO

    dashboard = json.loads((REPO / "deploy/grafana/inferd.json").read_text())
    filters = {v["name"]: v["query"]["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"}
    assert list(filters) == ["job", "instance", "model"]  # (Grafana's variables: every panel narrowed by them)
    queries = [(panel["title"], target["expr"]) for panel in dashboard["panels"] for target in panel["targets"]]
    for title, expr in queries:
        selectors = re.findall(r"inferd_[a-z_]+(?:\{[^}]*\})?", expr)
        assert selectors and all('job=~"$job", instance=~"$instance", model=~"$model"' in s for s in selectors), (title, expr)
    # The variables as Grafana fills them with All (".*"), and the series their label_values() read
    queries = [(title, expr.replace("$job", ".*").replace("$instance", ".*").replace("$model", ".*")) for title, expr in queries]
    queries += [(f"variable {name}", re.sub(r"label_values\((.*), \w+\)", r"\1", query).replace("$job", ".*").replace(
        "$instance", ".*")) for name, query in filters.items()]
    model = sim_model(latency_ms=10, max_batch_size=8, slo_ms=200, options={"per_item_ms": 2, "jitter": 0.2})
    async with running_server(model) as srv:
        port = free_port()
        config = tmp_path / "prometheus.yml"
        config.write_text("global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: inferd\n    static_configs:\n"
                          f"      - targets: ['127.0.0.1:{srv.port}']\n")
        prom = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'data'}",
                                 f"--web.listen-address=127.0.0.1:{port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            empty: dict[str, str] = {}
            sent = iter(range(10**6))

            async def every_batch_panel_has_data() -> bool:
                i = next(sent)
                bursts = [infer(http, srv.url, {"input": f"d{i}-{j}"}) for j in range(60)]  # past the objective: refusals
                bursts.append(infer(http, srv.url, {"input": f"d{i}", "timeout_ms": "soon"}))  # a 400
                await asyncio.gather(*bursts)
                empty.clear()
                for title, expr in queries:
                    try:
                        async with http.get(f"http://127.0.0.1:{port}/api/v1/query", params={"query": expr}) as resp:
                            answer = await resp.json()
                    except Exception:  # noqa: BLE001 - prometheus still starting
                        return False
                    assert answer["status"] == "success", (title, expr, answer)  # valid PromQL, every panel
                    if not title.startswith("Generation:") and not answer["data"]["result"]:
                        empty[title] = expr
                return not empty

            try:
                await until(every_batch_panel_has_data, timeout_s=60, step_s=1.0)
            except AssertionError:
                raise AssertionError(f"panels without data: {empty}") from None
        finally:
            prom.terminate()
            prom.wait(10)
