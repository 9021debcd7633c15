"""The configuration we ship in deploy/ is valid for the tools it is written for."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from .conftest import REPO


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package 'prometheus')")
def test_prometheus_config_and_alert_rules_are_valid():
    rules = subprocess.run(["promtool", "check", "rules", str(REPO / "deploy/prometheus/alerts.yml")],
                           capture_output=True, text=True, timeout=60)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    config = subprocess.run(["promtool", "check", "config", str(REPO / "deploy/prometheus/prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr


def test_alerts_and_hpa_use_metrics_the_server_exports():
    from prometheus_client import generate_latest

    from inferd.lifecycle import Lifecycle
    from inferd.metrics import InferdCollector, RequestMetrics, build_registry

    text = generate_latest(build_registry(InferdCollector({}, RequestMetrics(), Lifecycle()))).decode()
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    shipped = (REPO / "deploy/prometheus/alerts.yml").read_text() + (REPO / "deploy/k8s/hpa.yaml").read_text()
    for name in ("inferd_predicted_wait_seconds", "inferd_workers_healthy", "inferd_batch_size",
                 "inferd_request_duration_seconds", "inferd_shed_total", "inferd_predicted_wait_max_seconds"):
        assert name in shipped and name in exported, name
