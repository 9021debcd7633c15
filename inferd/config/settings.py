"""The configuration's typed records: one dataclass per TOML table, with its defaults."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class AdapterConfig:
    """A LoRA adapter of a generation model: requests name it as their `model` (or `model@adapter`)
    and it runs in the base engine's batches (vLLM's multi-LoRA)."""

    name: str
    path: str  # a local folder in PEFT's layout (adapter_config.json, adapter_model.safetensors)
    pinned: bool = False  # kept loaded on the device, never evicted for another adapter


@dataclass(frozen=True)
class ModelConfig:
    """One served model: its batch function and how requests are batched for it."""

    name: str
    backend: str  # "package.module:callable", or "package.module" for its `create` factory
    version: str = "1"  # a model may have several; requests name one (`model@version`) or get the split
    traffic: float | None = None  # this version's share of requests that name no version (None: see parsing)
    kind: str = "batch"  # "batch": our batcher and executor threads; "generation": a vLLM engine
    max_batch_size: int = 32
    max_wait_ms: float = 5.0  # linger, counted from the oldest waiting request
    slo_ms: float | None = None  # a latency objective, from admission to answer: admitted only if predicted to meet it
    refuse_early: bool = True  # refuse at once what is predicted to miss its due (false: deadlines only, 504 when missed)
    max_batch_tokens: int | None = None  # a batch's token budget besides max_batch_size (None: none)
    workers: int = 1  # executor threads, one per GPU
    devices: tuple[str, ...] = ()  # one per worker; default "auto:0", "auto:1", ...
    max_queue: int = 1000  # requests waiting for a batch before 503
    timeout_ms: int = 10_000  # default deadline of a request
    max_timeout_ms: int = 60_000  # a client's timeout_ms is capped at this
    max_input_chars: int = 100_000
    max_inputs_per_call: int = 2048  # items of one /v1/embeddings call (each batched as a request)
    factory: bool | None = None  # None: a factory is recognised by @backend_factory
    warmup_inputs: tuple[str, ...] = ("warmup",)
    batch_timeout_ms: int = 10_000  # the hang watchdog's floor; the limit is max(this, 3 x measured p99)
    max_batch_attempts: int = 3  # runs of a request (after hangs, dead workers) before it fails with 500
    max_isolation_calls: int = 32  # extra backend calls allowed to find the poison inputs of a failed batch
    breaker_failures: int = 5  # consecutive batches that fail outright before the model stops being fed
    breaker_cooldown_ms: int = 5_000  # then, how long before one probe batch is let through
    max_waiting_requests: int = 256  # generation: requests without a first token yet, before 503
    max_waiting_prompt_tokens: int = 65_536  # generation: their prompt tokens, before 503
    ttft_slo_ms: float | None = None  # generation: time to first token promised at admission (None: none)
    tpot_slo_ms: float | None = None  # generation: time per output token promised at admission (None: none)
    collapse: bool = True  # batch: identical inputs in flight share one computation
    collapse_scope: str = "shared"  # "tenant": only within a tenant (no tenant learns what another is asking)
    cache_bytes: int = 0  # batch: the result cache's size (0: no cache)
    cache_ttl_s: float = 300.0  # how long a cached output is served
    cache_scope: str = "tenant"  # "tenant": each tenant its own entries; "shared": one for all
    options: Mapping[str, Any] = field(default_factory=dict)
    adapters: tuple[AdapterConfig, ...] = ()  # generation: its LoRA adapters ([[models.adapters]])

    @property
    def worker_devices(self) -> tuple[str, ...]:
        return self.devices or tuple(f"auto:{i}" for i in range(self.workers))


@dataclass(frozen=True)
class AuthConfig:
    """API keys. Without an [auth] table every request is anonymous and admin endpoints are closed."""

    enabled: bool = False
    anonymous_tier: str | None = None  # None (with [auth]): anonymous requests get 401
    admin_key_sha256: str | None = None
    operations: str = "open"  # /metrics, /v1/stats, /v1/models: "open", "key" (any valid key) or "admin"
    unknown_keys: str = "refuse"  # "anonymous": a key no tenant has is served as anonymous (OpenAI clients always send one)


DEFAULT_TIER_PRIORITIES = {"enterprise": 2, "paid": 1, "free": 0}


@dataclass(frozen=True)
class TierConfig:
    """A class of service. Batches are filled from the highest priority down."""

    name: str
    priority: int = 0  # defaults: enterprise 2, paid 1, free 0, anything else 0
    rate_per_s: float | None = None  # token bucket per tenant and model (None: unlimited), at full capacity
    burst: float | None = None  # bucket size; default max(1, rate_per_s)
    slo_ms: float | None = None  # a latency objective for this tier's requests (the tighter of it and the model's holds)
    ttft_slo_ms: float | None = None  # generation: this tier's time to first token (the tighter of it and the model's)
    tpot_slo_ms: float | None = None  # generation: this tier's time per output token (likewise)
    max_predicted_wait_ms: float | None = None  # refuse new requests past this predicted wait (None: deadline only)
    promote_after_ms: float | None = None  # starvation guard: waiting this long, a request is served first


@dataclass(frozen=True)
class TenantConfig:
    """An API key's owner."""

    name: str
    tier: str
    key_sha256: str
    rate_per_s: float | None = None  # overrides the tier's
    burst: float | None = None


@dataclass(frozen=True)
class TracingConfig:
    """OpenTelemetry traces (a [tracing] table turns them on; without one nothing of OpenTelemetry loads)."""

    enabled: bool = False
    sample_rate: float = 0.01  # share of requests without a client's traceparent that are traced
    max_client_traced_per_s: float = 10.0  # a client's "sampled" traceparent is honoured this often at most
    flush_timeout_s: float = 2.0  # at shutdown, spans still queued are sent for this long at most, then dropped
    exporter: str = "otlp"  # "otlp" (JSON over HTTP to `endpoint`), "otlp-protobuf", "console" (stderr), "file" (`path`)
    endpoint: str = "http://127.0.0.1:4318/v1/traces"
    path: str = "inferd-spans.jsonl"  # one JSON span per line
    service_name: str = "inferd"


@dataclass(frozen=True)
class ServerConfig:
    """The process: where it listens, and the models it serves (the first one is the default)."""

    host: str = "127.0.0.1"
    port: int = 8000
    max_body_bytes: int = 1 << 20
    header_timeout_s: float = 10.0  # from a request's first byte to the end of its headers, else 408 and close
    body_timeout_s: float = 30.0  # to receive a whole body once the headers are in, else 408 and close
    keepalive_timeout_s: float = 75.0  # an idle connection between requests is closed after this
    max_connections: int = 0  # open connections (0: the file-descriptor limit less 256); past it, closed at once
    connection_reserve: int = 32  # the last of max_connections: /healthz and /readyz only
    answer_half_closed: bool = False  # true: a client that shuts its side after sending still gets the answer
    fast_path: bool = True  # /v1/inference and the calls of several inputs answered from the connection, without aiohttp's task
    idempotency_window_s: float = 300.0  # a repeated Idempotency-Key gets the stored answer this long (0: off)
    idempotency_max_keys: int = 100_000  # answers kept for repeats, at most (the heaviest tenant's oldest go first)
    idempotency_max_bytes: int = 64 << 20  # and at most this many bytes of them
    grace_period_s: float = 30.0  # how long admitted requests get to finish after SIGTERM
    lame_duck_s: float = 0.0  # after SIGTERM, keep serving this long while health checks notice /readyz 503
    agent_port: int | None = None  # HAProxy agent-check port (weight from predicted wait); None: off
    agent_full_wait_ms: float = 1000.0  # predicted wait at which the agent's weight bottoms out at 1%
    grpc_port: int | None = None  # the Open Inference Protocol over gRPC on this port (needs inferd[grpc]); None: off
    metrics: bool = True  # record metrics and serve GET /metrics
    access_log: str = "info"  # level of the JSON access log lines, or "off"
    access_log_sample_rate: float = 0.01  # share of requests logged; 500 and 504 answers are always logged
    gc_threshold: int = 50_000  # cyclic GC after this many new objects (Python's default: 700); 0 keeps Python's
    memory_headroom_mb: int = 1024  # a model version is not loaded when it would leave less memory than this
    gil_switch_interval_ms: float = 0.2  # longest an executor thread waits for the GIL a busy loop holds (Python: 5)
    worker_nice: int = 0  # the models' threads this many nice levels below the event loop's CPU priority (0: the same)
    keep_freed_memory_mb: int = 512  # freed memory malloc keeps for reuse, not handed back (glibc; 0: its own policy)
    models: tuple[ModelConfig, ...] = ()
    auth: AuthConfig = AuthConfig()
    tiers: tuple[TierConfig, ...] = (TierConfig("default"),)
    tenants: tuple[TenantConfig, ...] = ()
    tracing: TracingConfig = TracingConfig()

    @property
    def default_model(self) -> str:
        return self.models[0].name


def default_config() -> ServerConfig:
    """What `inferd serve` runs with no --config: the seed's workload on one simulated GPU."""
    return ServerConfig(
        models=(
            ModelConfig(
                name="batchstring",
                backend="inferd.backends.sim:create",
                max_batch_size=100,
                max_wait_ms=20,
                options={"latency_ms": 100, "max_batch_size": 100},
            ),
        )
    )
