"""Reading a TOML file into the typed records of `settings`, checking every table as it goes.

Unknown keys are errors: a misspelt `max_wait_ms` silently falling back to a default is the kind of
mistake an operator only finds under load.

Why one module: every table is read here so that one ConfigError says every problem of a file, the
checks across tables (versions, names, adapters) included.
"""

from __future__ import annotations

import importlib.util
import re
import tomllib
from collections.abc import Callable, Mapping
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

from ..typed_tables import ConfigError, check_types, field_names, reject_unknown
from .settings import (
    DEFAULT_TIER_PRIORITIES,
    AdapterConfig,
    AuthConfig,
    ModelConfig,
    ServerConfig,
    TenantConfig,
    TierConfig,
    TracingConfig,
)

T = TypeVar("T")


def load_config(path: str | Path) -> ServerConfig:
    try:
        raw = tomllib.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ConfigError(f"config file not found: {path}") from exc
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from exc
    return parse_config(raw)


class _Problems:
    """Every table is read even after a mistake in another, so one ConfigError says all of them."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def attempt(self, read: Callable[[], T], fallback: T) -> T:
        try:
            return read()
        except ConfigError as exc:
            self.found.extend(exc.problems)
            return fallback


def parse_config(raw: Mapping[str, Any]) -> ServerConfig:
    problems = _Problems()
    problems.attempt(lambda: reject_unknown(raw, {"server", "models", "auth", "tiers", "tenants", "tracing"}, "top level"), None)
    tables = {}
    for table in ("server", "auth", "tiers", "tracing"):
        tables[table] = raw.get(table)
        if not isinstance(raw.get(table, {}), dict):
            problems.found.append(f"[{table}] must be a table, not {type(raw[table]).__name__}")
            tables[table] = None
    server: dict[str, Any] = problems.attempt(lambda: _read_server(dict(tables["server"] or {})), {})
    models_raw = raw.get("models", [])
    if not isinstance(models_raw, list) or not models_raw:
        problems.found.append("at least one [[models]] table is required")
        models_raw = []
    read: list[ModelConfig | None] = [problems.attempt(partial(parse_model, m), None) for m in models_raw]
    models = tuple(m for m in read if m is not None)
    if len(models) == len(read):
        problems.attempt(lambda: check_versions(models), None)
    tiers: tuple[TierConfig, ...] = problems.attempt(lambda: _parse_tiers(tables["tiers"]), (TierConfig("default"),))
    auth = problems.attempt(lambda: _parse_auth(tables["auth"]), AuthConfig())
    tenants: tuple[TenantConfig, ...] = problems.attempt(lambda: _parse_tenants(raw.get("tenants", []), {t.name for t in tiers}), ())
    tracing = problems.attempt(lambda: _parse_tracing(tables["tracing"]), TracingConfig())
    if problems.found:  # (the checks across tables below would only repeat these in other words)
        raise ConfigError(*problems.found)
    config = ServerConfig(**server, models=models, auth=auth, tiers=tiers, tenants=tenants, tracing=tracing)
    _check_server(config)
    return config


def _read_server(table: dict[str, Any]) -> dict[str, Any]:
    reject_unknown(table, field_names(ServerConfig) - {"models", "auth", "tiers", "tenants", "tracing"}, "[server]")
    check_types(table, ServerConfig, "[server]")
    return table


def check_versions(models: tuple[ModelConfig, ...]) -> None:
    """A (name, version) once; several versions only for batch models; a split to go to; each name one thing's."""
    keys = [(m.name, m.version) for m in models]
    if len(set(keys)) != len(keys):
        raise ConfigError(f"each model version must be configured once: {[f'{n}@{v}' for n, v in keys]}")
    adapters = [(a.name, m.name) for m in models for a in m.adapters]
    names = {m.name for m in models}
    for adapter, model in (a for a in adapters if a[0] in names):  # (a request names an adapter as its `model`)
        raise ConfigError(f"model {model}: adapter {adapter!r} has a model's name: each name once, models and adapters")
    if len({a for a, _ in adapters}) != len(adapters):
        raise ConfigError(f"each adapter name once across models: {sorted(a for a, _ in adapters)}")
    for name in names:
        versions = [m for m in models if m.name == name]
        if len(versions) > 1 and any(m.kind != "batch" for m in versions):
            raise ConfigError(f"model {name}: only batch models have several versions")
        if any(m.traffic is not None for m in versions) and not 0 < sum(m.traffic or 0 for m in versions) < float("inf"):
            raise ConfigError(f"model {name}: its versions' `traffic` must add up to more than 0, and not overflow")


def _parse_tiers(raw: Any) -> tuple[TierConfig, ...]:
    if raw is None:
        return (TierConfig("default"),)
    if not isinstance(raw, dict) or not raw:
        raise ConfigError("[tiers] must hold at least one [tiers.NAME] table")
    tiers = []
    for name, table in raw.items():
        where = f"[tiers.{name}]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table")
        reject_unknown(table, field_names(TierConfig) - {"name"}, where)
        check_types(table, TierConfig, where)
        tier = TierConfig(name=name, **{"priority": DEFAULT_TIER_PRIORITIES.get(name, 0), **table})
        for key in ("rate_per_s", "burst", "max_predicted_wait_ms", "promote_after_ms", "slo_ms",
                    "ttft_slo_ms", "tpot_slo_ms"):
            value = getattr(tier, key)
            if value is not None and (not isinstance(value, (int, float)) or value <= 0):
                raise ConfigError(f"{where}: `{key}` must be a positive number")
        tiers.append(tier)
    return tuple(sorted(tiers, key=lambda t: -t.priority))


def _parse_tenants(raw: Any, tier_names: set[str]) -> tuple[TenantConfig, ...]:
    if not isinstance(raw, list):
        raise ConfigError("[[tenants]] must be an array of tables")
    tenants = []
    for table in raw:
        where = f"[[tenants]] {table.get('name', '?')!r}" if isinstance(table, dict) else "[[tenants]]"
        if not isinstance(table, dict):
            raise ConfigError(f"{where} must be a table")
        reject_unknown(table, field_names(TenantConfig), where)
        check_types(table, TenantConfig, where)
        for key in ("name", "tier", "key_sha256"):
            if not isinstance(table.get(key), str):
                raise ConfigError(f"{where}: `{key}` is required")
        if table["tier"] not in tier_names:
            raise ConfigError(f"{where}: unknown tier {table['tier']!r}; tiers: {sorted(tier_names)}")
        _check_sha256(table["key_sha256"], f"{where} key_sha256")
        tenants.append(TenantConfig(**{**table, "key_sha256": table["key_sha256"].lower()}))
    digests = [t.key_sha256 for t in tenants]
    if len(set(digests)) != len(digests):
        raise ConfigError("two [[tenants]] share one key")
    return tuple(tenants)


def _parse_auth(raw: Any) -> AuthConfig:
    if raw is None:
        return AuthConfig()
    if not isinstance(raw, dict):
        raise ConfigError("[auth] must be a table")
    reject_unknown(raw, field_names(AuthConfig) - {"enabled"}, "[auth]")
    check_types(raw, AuthConfig, "[auth]")
    if raw.get("admin_key_sha256") is not None:
        _check_sha256(raw["admin_key_sha256"], "[auth] admin_key_sha256")
    if raw.get("operations", "open") not in ("open", "key", "admin"):
        raise ConfigError("[auth] `operations` must be open, key or admin")
    if raw.get("unknown_keys", "refuse") not in ("refuse", "anonymous"):
        raise ConfigError("[auth] `unknown_keys` must be refuse or anonymous")
    if raw.get("unknown_keys") == "anonymous" and raw.get("anonymous_tier") is None:
        raise ConfigError("[auth] unknown_keys = \"anonymous\" needs anonymous_tier (the tier they are served in)")
    return AuthConfig(**{**raw, "enabled": True, "admin_key_sha256": raw.get("admin_key_sha256", "").lower() or None})


def _parse_tracing(raw: Any) -> TracingConfig:
    if raw is None:
        return TracingConfig()
    if not isinstance(raw, dict):
        raise ConfigError("[tracing] must be a table")
    reject_unknown(raw, field_names(TracingConfig) - {"enabled"}, "[tracing]")
    check_types(raw, TracingConfig, "[tracing]")
    tracing = TracingConfig(**{**raw, "enabled": True})
    if not 0.0 <= tracing.sample_rate <= 1.0 or tracing.exporter not in ("otlp", "otlp-protobuf", "console", "file"):
        raise ConfigError("[tracing] sample_rate must be between 0 and 1, exporter otlp, otlp-protobuf, console or file")
    if tracing.max_client_traced_per_s < 0 or tracing.flush_timeout_s <= 0:
        raise ConfigError("[tracing] max_client_traced_per_s must be 0 or more, flush_timeout_s more than 0")
    return tracing


def _check_sha256(value: Any, where: str) -> None:
    if not isinstance(value, str) or len(value) != 64 or any(c not in "0123456789abcdefABCDEF" for c in value):
        raise ConfigError(f"{where} must be the 64 hex digits of a SHA-256 (keys are never stored in plain text)")


def parse_model(raw: Any) -> ModelConfig:
    if not isinstance(raw, dict):
        raise ConfigError("each [[models]] entry must be a table")
    where = f"[[models]] {raw.get('name', '?')!r}"
    try:  # (an unknown key does not hide the table's other mistakes: the rest is read all the same)
        reject_unknown(raw, field_names(ModelConfig), where)
    except ConfigError as unknown:
        raw = {k: v for k, v in raw.items() if k in field_names(ModelConfig)}
        try:
            parse_model(raw)
        except ConfigError as more:
            raise ConfigError(*unknown.problems, *more.problems) from None
        raise
    adapters = _parse_adapters(raw.get("adapters", []), where)
    raw = {k: v for k, v in raw.items() if k != "adapters"}
    check_types(raw, ModelConfig, where)
    for key in ("name", "backend"):
        if not isinstance(raw.get(key), str) or not raw[key]:
            raise ConfigError(f"{where}: `{key}` is required and must be a non-empty string")
    values = dict(raw)
    for key in ("devices", "warmup_inputs"):
        if key in values:
            values[key] = tuple(values[key])
    if values.get("devices") and "workers" not in values:
        values["workers"] = len(values["devices"])
    model = ModelConfig(**values, adapters=adapters)
    _check_model(model, where)
    return model


MAX_BATCH_SIZE = 4096  # a batch's curve rebuild stays ~0.5 ms on the loop (1,000,000 once took a model's p99 to 196 ms)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._:-]{0,127}")  # a model's, version's, adapter's: an admin path segment


def _parse_adapters(raw: Any, where: str) -> tuple[AdapterConfig, ...]:
    """[[models.adapters]]: each a name and a folder (the names distinct: `check_versions`)."""
    if not isinstance(raw, list) or not all(isinstance(a, dict) for a in raw):
        raise ConfigError(f"{where}: `adapters` must be [[models.adapters]] tables")
    adapters = []
    for table in raw:
        at = f"{where} adapter {table.get('name', '?')!r}"
        reject_unknown(table, field_names(AdapterConfig), at)
        check_types(table, AdapterConfig, at)
        if not all(isinstance(table.get(key), str) and table[key] for key in ("name", "path")):
            raise ConfigError(f"{at}: `name` and `path` are required strings")
        if not NAME.fullmatch(table["name"]):
            raise ConfigError(f"{at}: `name` must be letters, digits and . _ : - (at most 128)")
        adapters.append(AdapterConfig(**table))
    return tuple(adapters)


def _check_model(m: ModelConfig, where: str) -> None:
    positive_ints = ("max_batch_size", "workers", "max_queue", "timeout_ms", "max_timeout_ms", "max_input_chars",
                     "max_inputs_per_call", "batch_timeout_ms", "max_batch_attempts", "breaker_failures",
                     "breaker_cooldown_ms", "max_waiting_requests", "max_waiting_prompt_tokens")
    if m.kind not in ("batch", "generation"):
        raise ConfigError(f"{where}: `kind` must be batch or generation")
    if m.adapters and m.kind != "generation":
        raise ConfigError(f"{where}: only generation models have adapters")
    if m.kind != "generation" and (m.ttft_slo_ms is not None or m.tpot_slo_ms is not None):
        raise ConfigError(f"{where}: `ttft_slo_ms` and `tpot_slo_ms` are for generation models (a batch model has `slo_ms`)")
    if m.max_batch_size > MAX_BATCH_SIZE:  # (the cost model keeps a curve of every size, made again per batch)
        raise ConfigError(f"{where}: `max_batch_size` is at most {MAX_BATCH_SIZE}, got {m.max_batch_size}")
    for key in (*positive_ints, "slo_ms", "max_batch_tokens", "ttft_slo_ms", "tpot_slo_ms"):  # (types were checked against the fields)
        value = getattr(m, key)
        if value is not None and value <= 0:
            raise ConfigError(f"{where}: `{key}` must be positive, got {value!r}")
    if m.max_isolation_calls < 0 or m.max_wait_ms < 0:
        raise ConfigError(f"{where}: `max_isolation_calls` and `max_wait_ms` must be >= 0")
    if m.devices and len(m.devices) != m.workers:
        raise ConfigError(f"{where}: `workers` ({m.workers}) disagrees with the `devices` list ({len(m.devices)})")
    if m.timeout_ms > m.max_timeout_ms:
        raise ConfigError(f"{where}: `timeout_ms` exceeds `max_timeout_ms`")
    if m.traffic is not None and m.traffic < 0:
        raise ConfigError(f"{where}: `traffic` must be >= 0")
    for key in ("name", "version"):  # (both are path segments of the admin API, and go into log lines)
        if not NAME.fullmatch(getattr(m, key)):
            raise ConfigError(f"{where}: `{key}` must be 1-128 letters, digits, '.', '_', '-' or ':' "
                              f"(starting with a letter or digit), got {getattr(m, key)!r}")
    if m.cache_bytes < 0 or m.cache_ttl_s <= 0 or m.cache_scope not in ("tenant", "shared"):
        raise ConfigError(f"{where}: `cache_bytes` must be >= 0, `cache_ttl_s` positive, `cache_scope` tenant or shared")
    if m.collapse_scope not in ("tenant", "shared"):
        raise ConfigError(f"{where}: `collapse_scope` must be tenant or shared")
    if m.collapse_scope == "tenant" and m.cache_bytes and m.cache_scope == "shared":
        raise ConfigError(f"{where}: `collapse_scope = \"tenant\"` with a shared cache: the cache would answer across "
                          "tenants what collapsing no longer does; set `cache_scope = \"tenant\"`")
    if not m.warmup_inputs:
        raise ConfigError(f"{where}: `warmup_inputs` must hold at least one input")


def _check_server(c: ServerConfig) -> None:
    # (types were checked against the fields: see check_types)
    ports = {"port": c.port, "agent_port": c.agent_port, "grpc_port": c.grpc_port}
    for key, value in ports.items():
        if value is not None and not 0 <= value < 65536:
            raise ConfigError(f"[server] {key} out of range: {value!r}")
    taken = [key for key, value in ports.items() if value and list(ports.values()).count(value) > 1]
    if taken:
        raise ConfigError(f"[server] {' and '.join(taken)} are the same port: each needs a port of its own")
    if c.grpc_port is not None and not all(importlib.util.find_spec(name) for name in ("grpc", "tritonclient")):
        raise ConfigError("[server] grpc_port needs grpcio and tritonclient's protocol stubs: pip install 'inferd[grpc]'")
    for key in ("max_body_bytes", "header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
        if getattr(c, key) <= 0:
            raise ConfigError(f"[server] `{key}` must be positive")
    if c.idempotency_window_s < 0 or c.idempotency_max_keys <= 0 or c.idempotency_max_bytes <= 0:
        raise ConfigError("[server] idempotency_window_s must be >= 0, idempotency_max_keys and _max_bytes positive")
    if c.grace_period_s < 0 or c.lame_duck_s < 0 or c.max_connections < 0 or c.connection_reserve < 0:
        raise ConfigError("[server] grace_period_s, lame_duck_s, max_connections, connection_reserve must be >= 0")
    if c.max_connections and c.connection_reserve >= c.max_connections:
        raise ConfigError("[server] connection_reserve must be below max_connections")
    tier_names = {t.name for t in c.tiers}
    anonymous = c.auth.anonymous_tier
    if anonymous is not None and anonymous not in tier_names:
        raise ConfigError(f"[auth] anonymous_tier {anonymous!r} is not a tier; tiers: {sorted(tier_names)}")
    if not c.auth.enabled and "default" not in tier_names:
        raise ConfigError("[tiers] without [auth]: say which tier anonymous requests get ([auth] anonymous_tier)")
    if not 0.0 <= c.access_log_sample_rate <= 1.0:
        raise ConfigError("[server] access_log_sample_rate must be between 0 and 1")
    if not 0 < c.gil_switch_interval_ms <= 100:
        raise ConfigError("[server] gil_switch_interval_ms must be a number of ms in (0, 100]")
    if c.gc_threshold < 0:
        raise ConfigError("[server] gc_threshold must be an integer >= 0")
    if not 0 <= c.worker_nice <= 19:
        raise ConfigError("[server] worker_nice must be an integer from 0 to 19 (Linux nice levels)")
    if c.keep_freed_memory_mb < 0:
        raise ConfigError("[server] keep_freed_memory_mb must be an integer >= 0")
    if c.access_log.lower() not in ("off", "debug", "info", "warning", "error"):
        raise ConfigError("[server] access_log must be off, debug, info, warning or error")
