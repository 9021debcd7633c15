import tomllib
from pathlib import Path

import pytest

from inferd.backends.vllm import engine_settings
from inferd.config import ConfigError, default_config, load_config, parse_config

MINIMAL = {"models": [{"name": "m", "backend": "inferd.backends.sim:create"}]}


def test_default_toml_loads_and_serves_the_seed_workload():
    config = load_config("config/default.toml")
    first = config.models[0]
    assert config.default_model == "batchstring"
    assert (first.max_batch_size, first.max_wait_ms, first.workers) == (100, 20, 1)
    assert first.options["latency_ms"] == 100


def test_the_generation_example_loads():
    model = load_config("config/generation.toml").models[0]
    assert (model.kind, model.backend, model.options["model_path"]) == ("generation", "inferd.backends.vllm",
                                                                       ".models/tiny-llama")


def test_the_gpu_generation_example_loads_and_keeps_cuda_graphs():
    model = load_config("config/generation-gpu.toml").models[0]
    settings = engine_settings(model.options, cuda=True)
    assert settings["enforce_eager"] is False and settings["gpu_memory_utilization"] == 0.9
    assert settings["enable_prefix_caching"] is True and "kv_cache_memory_bytes" not in settings


def test_embedded_default_matches_the_seed_workload():
    model = default_config().models[0]
    assert model.backend == "inferd.backends.sim:create"
    assert model.options == {"latency_ms": 100, "max_batch_size": 100}


def test_devices_list_sets_the_worker_count():
    raw = {"models": [{"name": "m", "backend": "x:y", "devices": ["cuda:0", "cuda:1"]}]}
    model = parse_config(raw).models[0]
    assert model.workers == 2
    assert model.worker_devices == ("cuda:0", "cuda:1")


def test_workers_default_to_auto_devices():
    raw = {"models": [{"name": "m", "backend": "x:y", "workers": 3}]}
    assert parse_config(raw).models[0].worker_devices == ("auto:0", "auto:1", "auto:2")


@pytest.mark.parametrize(
    "mutate, message",
    [
        (lambda r: r["models"][0].update(max_wait=5), "unknown keys"),
        (lambda r: r.update(sever={}), "unknown keys"),
        (lambda r: r["models"][0].update(max_batch_size=0), "max_batch_size"),
        (lambda r: r["models"][0].update(workers=True), "workers"),
        (lambda r: r["models"][0].update(max_wait_ms=-1), "max_wait_ms"),
        (lambda r: r["models"][0].update(timeout_ms=99999999), "max_timeout_ms"),
        (lambda r: r["models"][0].update(devices=["a"], workers=2), "disagrees"),
        (lambda r: r["models"].append(dict(r["models"][0])), "configured once"),
        (lambda r: r["models"].append({**r["models"][0], "version": "2", "kind": "generation"}), "only batch models"),
        (lambda r: r["models"][0].update(name="a@b"), "`name` must be"),
        (lambda r: r["models"][0].update(name="org/model"), "`name` must be"),  # (could never be unloaded)
        (lambda r: r["models"][0].update(collapse_scope="tenant", cache_bytes=1000, cache_scope="shared"), "shared cache"),
        (lambda r: r["models"][0].update(name="m\nforged log line"), "`name` must be"),
        (lambda r: r["models"][0].update(version=""), "`version` must be"),
        (lambda r: r["models"][0].update(traffic=0), "add up to more than 0"),
        (lambda r: r["models"].clear(), "at least one"),
        (lambda r: r["models"][0].pop("backend"), "backend"),
        (lambda r: r.update(server={"gc_threshold": -1}), "gc_threshold"),
        (lambda r: r.update(server={"worker_nice": 20}), "worker_nice"),
        (lambda r: r.update(server={"worker_nice": -1}), "worker_nice"),
        (lambda r: r.update(server={"keep_freed_memory_mb": -1}), "keep_freed_memory_mb"),
        (lambda r: r.update(server={"grpc_port": 70000}), "grpc_port out of range"),
        (lambda r: r.update(server={"port": 8000, "grpc_port": 8000}), "port and grpc_port are the same port"),
        (lambda r: r.update(server={"agent_port": 8001, "grpc_port": 8001}), "agent_port and grpc_port are the same"),
        (lambda r: r.update(server=5), r"\[server\] must be a table"),
        (lambda r: r.update(tracing="on"), r"\[tracing\] must be a table"),
        (lambda r: r.update(auth={"unknown_keys": "admit"}), "must be refuse or anonymous"),
        (lambda r: r.update(auth={"unknown_keys": "anonymous"}), "needs anonymous_tier"),
        (lambda r: r.update(tiers={"free": {"slo_ms": 0}}), "slo_ms"),
        (lambda r: r.update(tiers={"free": {"ttft_slo_ms": -5}}), "ttft_slo_ms"),
        (lambda r: r["models"][0].update(kind="generation", tpot_slo_ms=0), "tpot_slo_ms"),
        (lambda r: r["models"][0].update(ttft_slo_ms=500), "for generation models"),
        (lambda r: r["models"][0].update(adapters=[{"name": "a", "path": "/a"}]), "only generation models have adapters"),
        (lambda r: r["models"][0].update(kind="generation", adapters=[{"name": "a", "path": "/a"}] * 2), "each adapter name once"),
        (lambda r: r["models"][0].update(kind="generation", adapters=[{"name": r["models"][0]["name"], "path": "/a"}]),
         "has a model's name"),
        (lambda r: r["models"][0].update(kind="generation", adapters=[{"name": "a", "path": "/a", "rank": 8}]), "unknown keys"),
        (lambda r: r["models"][0].update(kind="generation", adapters=[{"name": "a@b", "path": "/a"}]), "`name` must be"),
        (lambda r: r["models"][0].update(kind="generation", adapters={"name": "a"}), "adapters"),
    ],
)
def test_bad_configs_are_refused_with_a_clear_message(mutate, message):
    raw = {"models": [dict(m) for m in MINIMAL["models"]]}
    mutate(raw)
    with pytest.raises(ConfigError, match=message):
        parse_config(raw)


def test_missing_file_and_bad_toml(tmp_path):
    with pytest.raises(ConfigError, match="not found"):
        load_config(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("[[models]\n")
    with pytest.raises(ConfigError, match="TOML"):
        load_config(bad)


@pytest.mark.parametrize(
    "mutate, key",
    [
        (lambda r: r.update(server={"access_log": 5}), "access_log"),
        (lambda r: r.update(server={"grace_period_s": "30"}), "grace_period_s"),
        (lambda r: r.update(server={"host": 5}), "host"),
        (lambda r: r.update(server={"metrics": "no"}), "metrics"),
        (lambda r: r.update(server={"max_body_bytes": True}), "max_body_bytes"),
        (lambda r: r["models"][0].update(devices=3), "devices"),
        (lambda r: r["models"][0].update(devices="cuda:0"), "devices"),  # not six workers, one per character
        (lambda r: r["models"][0].update(factory="yes"), "factory"),
        (lambda r: r["models"][0].update(warmup_inputs=[1, 2]), "warmup_inputs"),
        (lambda r: r["models"][0].update(options=[1]), "options"),
        (lambda r: r.update(tiers={"paid": {"priority": "high"}}), "priority"),
        (lambda r: r.update(auth={"anonymous_tier": 0}), "anonymous_tier"),
    ],
)
def test_a_value_of_the_wrong_type_is_one_line_naming_its_key(mutate, key):
    raw = {"models": [dict(m) for m in MINIMAL["models"]]}
    mutate(raw)
    with pytest.raises(ConfigError) as caught:
        parse_config(raw)
    message = str(caught.value)
    assert f"`{key}` must be" in message and "\n" not in message, message


def test_numbers_and_lists_of_the_right_kind_are_taken_as_they_are():
    raw = {"server": {"grace_period_s": 30, "metrics": False}, "models": [
        {"name": "m", "backend": "x:y", "max_wait_ms": 2, "devices": ["cpu"], "factory": True, "options": {"k": 1}}]}
    config = parse_config(raw)
    assert (config.grace_period_s, config.metrics, config.models[0].devices) == (30, False, ("cpu",))


def test_every_toml_snippet_of_the_readme_and_the_docs_is_a_valid_config_as_written():
    """A snippet without a [[models]] table gets one model; nothing else is added or replaced."""
    import re

    repo = Path(__file__).parents[2]
    pages = "".join(p.read_text(encoding="utf-8") for p in (repo / "README.md", *sorted((repo / "docs").glob("*.md"))))
    snippets = re.findall(r"```toml\n(.*?)```", pages, re.S)
    assert len(snippets) >= 5
    for snippet in snippets:
        raw = tomllib.loads(snippet)
        raw.setdefault("models", [{"name": "m", "backend": "inferd.backends.sim:create"}])
        parse_config(raw)


def test_a_generation_models_adapters_are_read_in_order():
    raw = {"models": [{**MINIMAL["models"][0], "kind": "generation",
                       "adapters": [{"name": "sql", "path": "/lora/sql", "pinned": True}, {"name": "chat", "path": "/lora/chat"}]}]}
    (model,) = parse_config(raw).models
    assert [(a.name, a.path, a.pinned) for a in model.adapters] == [("sql", "/lora/sql", True), ("chat", "/lora/chat", False)]


def test_an_adapter_name_is_apart_from_every_model_name_and_every_other_adapter():
    generation = {"name": "g", "kind": "generation", "backend": "inferd.backends.vllm",
                  "adapters": [{"name": "m", "path": "/a"}]}
    with pytest.raises(ConfigError, match="adapter 'm' has a model's name"):
        parse_config({"models": [{"name": "m", "backend": "inferd.backends.sim:create"}, generation]})
    twice = {**generation, "name": "h", "adapters": [{"name": "x", "path": "/a"}]}
    with pytest.raises(ConfigError, match="each adapter name once across models"):
        parse_config({"models": [{**generation, "adapters": [{"name": "x", "path": "/a"}]}, twice]})


def test_sizes_and_weights_an_operator_sets_are_bounded():
    model = {"name": "m", "backend": "inferd.backends.sim:create"}
    with pytest.raises(ConfigError, match="`max_batch_size` is at most 4096"):
        parse_config({"models": [{**model, "max_batch_size": 1_000_000}]})
    with pytest.raises(ConfigError, match="not overflow"):  # 1e308 twice: every share would be NaN
        parse_config({"models": [{**model, "traffic": 1e308}, {**model, "version": "2", "traffic": 1e308}]})


def test_every_mistake_of_a_model_table_at_once_and_a_near_miss_named():
    with pytest.raises(ConfigError) as refused:
        parse_config({"models": [{"name": "m", "backend": "inferd.backends.sim:create", "max_wait": 5,
                                  "max_batch_size": 0, "colapse": True}]})
    problems = refused.value.problems
    assert "unknown keys 'colapse' (did you mean 'collapse'?), 'max_wait' (did you mean 'max_wait_ms'?)" in problems[0]
    assert "allowed:" not in problems[0]  # (every key had a near miss: no list of all 33)
    assert any("`max_batch_size` must be positive" in p for p in problems)  # not hidden by the unknown keys
