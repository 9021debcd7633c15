"""The process: builds the models and the HTTP app, serves, and drains on SIGTERM.

aiohttp's own signal handling stops listening first and then cancels handlers; inferd runs its own
sequence instead: readiness turns 503 and new requests get 503 DRAINING (with `Connection: close`)
while every admitted request gets its answer, bounded by `grace_period_s`; then the workers stop and
the process exits 0.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import signal
import sys
import time
from collections.abc import Callable
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import uvloop
from aiohttp import web

from .admission.admission import Admission
from .admission.auth import Authenticator
from .admission.rate_limits import RateLimiter
from .calls.context import CallContext
from .calls.request_ids import RequestIds
from .config import ConfigError, ModelConfig, ServerConfig
from .errors import Draining, InferdError, describe
from .http.agent_check import start_agent_check
from .http.api import HttpApi
from .http.body_reader import BodyReader
from .http.connection_reserve import ConnectionLimits
from .http.connections import GuardedServer
from .http.idempotency import IdempotentReplies
from .http.operations import ServerFigures
from .lifecycle import Lifecycle, Phase
from .models.batch_model import BatchModel
from .models.config_reload import ConfigReload
from .models.registry import Models
from .models.rollout import Rollouts
from .observability.access_log import AccessLog
from .observability.dead_letters import DeadLetters
from .observability.metrics import InferdCollector, RequestMetrics, build_registry
from .observability.outcomes import Call, Outcomes
from .observability.tracing import Tracing
from .process_settings import connection_budget, freeze_survivors, keep_freed_memory, raise_open_file_limit

if TYPE_CHECKING:
    from .models.generation import GenerationModel

log = logging.getLogger("inferd.server")


class InferenceServer:
    """The whole process: the models, the gate in front of them, the HTTP side, and the drain."""

    def __init__(self, config: ServerConfig, span_exporter: Any = None) -> None:
        """`span_exporter`: where trace spans go instead of the configured exporter (tests)."""
        self.config = config
        self.tracing: Tracing | None = None
        self.rollouts: Rollouts | None = None
        self.config_reload: ConfigReload | None = None
        self._span_exporter = span_exporter
        self.lifecycle = Lifecycle()
        self.models = Models({}, {}, config.default_model if config.models else "")
        self.api: HttpApi | None = None
        self._runner: web.ServerRunner | None = None
        self._agent: asyncio.Server | None = None
        self._grpc: Any = None  # grpc.aio.Server, when [server] grpc_port is set
        self.grpc_port: int | None = None
        self._stopped = False

    async def start(self) -> None:
        """Start the workers (they build and warm up in their threads) and start listening at once,
        so /healthz answers while the models load."""
        loop = asyncio.get_running_loop()
        config = self.config
        request_metrics = RequestMetrics()
        self.dead_letters = DeadLetters()
        if config.tracing.enabled:
            self.tracing = Tracing(config.tracing, self._span_exporter)
        self.models = Models(
            {}, generation={m.name: _generation_model(m, loop, config.memory_headroom_mb << 20)
                            for m in config.models if m.kind == "generation"},
            default=config.default_model,
        )
        self.rollouts = Rollouts(
            self.models, lambda m: BatchModel(m, loop, request_metrics, self.dead_letters, config.tiers, self.tracing,
                                    worker_nice=config.worker_nice),
            headroom_bytes=config.memory_headroom_mb << 20, grace_s=config.grace_period_s,
        )
        self.rollouts.add_configured([m for m in config.models if m.kind == "batch"])
        self.config_reload = ConfigReload(self.rollouts, [m for m in config.models if m.kind == "batch"])
        limiter = RateLimiter(config)
        outcomes = Outcomes(request_metrics if config.metrics else None, AccessLog(config.access_log, config.access_log_sample_rate))
        registry = None
        if config.metrics:
            collector = InferdCollector(request_metrics, lambda: self.models.snapshots(time.monotonic()), lambda: self.ready)
            registry = build_registry(collector)
        admission = Admission(self.lifecycle, Authenticator(config, limiter), limiter, config.tiers)
        context = CallContext(self.models, admission, outcomes, self.lifecycle, RequestIds(), self.tracing)
        body = BodyReader(config.max_body_bytes, config.body_timeout_s, self.lifecycle)
        self.api = HttpApi(
            context, body, ServerFigures(limiter, self.dead_letters, registry, lambda: self.connections.stats()),
            IdempotentReplies(admission.auth, body, context.ids, config.idempotency_window_s,
                              config.idempotency_max_keys, config.idempotency_max_bytes),
            rollouts=self.rollouts, file_drift=self.config_reload.drift, fast_path=config.fast_path,
        )
        # The API reads bodies itself, with its own limits (413, 408): no client_max_size here.
        limits = ConnectionLimits(config.max_connections or connection_budget(), config.connection_reserve,
                                  config.header_timeout_s, config.answer_half_closed)
        self.connections = GuardedServer(
            self.api.handle, limits=limits, ids=self.api.ids, fast_path=self.api.fast_path, handler_cancellation=True,
            access_log=None, keepalive_timeout=config.keepalive_timeout_s,
            on_error=lambda request_id, error: outcomes.record(Call(time.monotonic(), request_id), error.status, error.code),
        )
        self._runner = web.ServerRunner(self.connections, shutdown_timeout=1.0)
        await self._runner.setup()
        site = web.TCPSite(self._runner, config.host, config.port, backlog=4096, reuse_address=True)
        try:
            await site.start()
        except OSError:
            await self._runner.cleanup()
            raise
        if config.grpc_port is not None:  # (grpcio is imported only where it is asked for)
            from .grpc.open_inference import OpenInferenceService, start_grpc_server

            service = OpenInferenceService(context)
            try:
                self._grpc, self.grpc_port = await start_grpc_server(service, config.host, config.grpc_port, config.max_body_bytes)
            except OSError:
                await self._runner.cleanup()
                raise
        self.models.start()  # once listening: a port in use stops the process before any model loads
        if config.agent_port is not None:
            self._agent = await start_agent_check(config.host, config.agent_port, self.models, lambda: self.ready,
                                                  config.agent_full_wait_ms)
        self.lifecycle.phase = Phase.SERVING
        log.debug("listening on %s; models loading", self.url)

    @property
    def ready(self) -> bool:
        """Serving, and every model ready: what /readyz, the agent-check and `inferd_ready` say."""
        return self.lifecycle.serving and self.models.ready

    @property
    def port(self) -> int:
        assert self._runner is not None
        return self._runner.addresses[0][1]

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until every model's workers are built and warm (tests, benchmarks)."""
        loop = asyncio.get_running_loop()
        give_up = loop.time() + timeout_s
        while not self.models.ready:
            failed = self.models.failed()
            if failed:
                error = failed[0].start_error
                assert error is not None  # (that is what failed means)
                raise StartupFailed(f"model {failed[0].name} failed to start: {describe(error)}")
            if loop.time() > give_up:
                raise TimeoutError("models did not become ready in time")
            await asyncio.sleep(0.02)

    async def reload(self, config: ServerConfig) -> list[str]:
        """Apply what changed in an edited config file's batch models (SIGHUP): what changes, one line
        each (ConfigError, nothing applied, when any of it cannot be)."""
        assert self.config_reload is not None
        changes = await self.config_reload.apply(config)
        if replace(config, models=(), host=self.config.host, port=self.config.port) != replace(self.config, models=()):
            changes.append("settings other than [[models]] are not reloaded: restart (SIGTERM drains) to apply them")
        for line in changes or ["no change"]:
            log.warning("config reload: %s", line)
        return changes

    async def drain_and_stop(self) -> bool:
        """The SIGTERM sequence. True when every admitted request was answered within the grace period."""
        if self._stopped:
            return True
        self._stopped = True
        if self.config.lame_duck_s > 0:
            self.lifecycle.phase = Phase.LAME_DUCK
            log.info("lame duck: /readyz 503, serving on for %.1f s", self.config.lame_duck_s)
            await asyncio.sleep(self.config.lame_duck_s)
        self.lifecycle.phase = Phase.DRAINING
        log.info("draining: %d requests in flight, grace period %.1f s", self.lifecycle.in_flight, self.config.grace_period_s)
        drained = await self.lifecycle.wait_idle(self.config.grace_period_s)
        if not drained:
            log.warning("grace period over with %d requests in flight; answering them 503 DRAINING", self.lifecycle.in_flight)
        reason = Draining("server shut down before this request ran; retry on another instance", retry_after_ms=1000)
        if self.rollouts is not None:
            await self.rollouts.close()
        await self.models.stop(reason)
        if self.tracing is not None:
            await asyncio.to_thread(self.tracing.shutdown)  # (its last spans go out)
        await self.lifecycle.wait_idle(1.0)  # let handlers write those last answers
        if self._agent is not None:
            self._agent.close()
        if self._grpc is not None:
            await self._grpc.stop(1.0)  # (what is still open gets a second, as HTTP's connections do)
        if self._runner is not None:
            await self._runner.cleanup()
        log.info("stopped")
        return drained


def _generation_model(config: ModelConfig, loop: asyncio.AbstractEventLoop, headroom_bytes: int) -> GenerationModel:
    from .models.generation import GenerationModel  # imports vLLM's wrapper only when a generation model is served

    return GenerationModel(config, loop, headroom_bytes)


class StartupFailed(RuntimeError):
    """A model could not be built when the server started."""


async def serve(config: ServerConfig, reread: Callable[[], ServerConfig] | None = None) -> int:
    """Run until SIGTERM or SIGINT, then drain: exit status 0. When the server cannot start (the port is
    taken, a model cannot be built) one line on stderr and 1, so a supervisor sees the mistake at once
    rather than a process that answers 503 for ever. (A worker that fails later is replaced, with backoff.)"""
    server = InferenceServer(config)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # SIGHUP: the config file again, its batch models applied (without a file there is nothing to re-read).
    reloads: set[asyncio.Task] = set()
    loop.add_signal_handler(signal.SIGHUP, _reload, server, reread, reloads)
    try:
        await server.start()
    except OSError as exc:
        _fatal(f"cannot listen on {exc.filename or f'{config.host}:{config.port}'}: {exc.strerror or exc}")
        return 1
    grpc = f" (gRPC on {config.host}:{server.grpc_port})" if server.grpc_port is not None else ""
    print(f"inferd listening on {server.url}{grpc}", file=sys.stderr, flush=True)
    startup = loop.create_task(server.wait_ready(timeout_s=24 * 3600))
    stopping = loop.create_task(stop.wait())
    await asyncio.wait((startup, stopping), return_when=asyncio.FIRST_COMPLETED)
    failure = startup.exception() if startup.done() else None
    if failure is not None:
        _fatal(str(failure))
        stopping.cancel()
        await server.drain_and_stop()
        return 1
    if startup.done():
        models = ", ".join(dict.fromkeys(m.name for m in server.models.all()))
        print(f"inferd ready on {server.url}: {models}", file=sys.stderr, flush=True)
        freeze_survivors()
        await stopping
    startup.cancel()
    await server.drain_and_stop()
    return 0


def _reload(server: InferenceServer, reread: Callable[[], ServerConfig] | None, running: set[asyncio.Task]) -> None:
    """SIGHUP's handler: the reload runs as a task (its checks import modules off the loop)."""
    if reread is None or server.rollouts is None:
        log.warning("SIGHUP: no config file to re-read (started without --config: --model folders or the default)")
        return

    async def reload() -> None:
        try:
            await server.reload(reread())
        except (ConfigError, InferdError, OSError) as exc:
            log.error("config reload refused, nothing changed: %s", exc)
        except Exception:  # a bug of ours, not the file's: said with its traceback, once
            log.exception("config reload failed")

    task = asyncio.get_running_loop().create_task(reload(), name="config-reload")
    running.add(task)
    task.add_done_callback(running.discard)


def _fatal(message: str) -> None:
    print(f"inferd: {message}", file=sys.stderr, flush=True)


def run(config: ServerConfig, reread: Callable[[], ServerConfig] | None = None) -> int:
    raise_open_file_limit()
    # An executor thread coming back from the GPU (or a sleep, or any call that let go of the GIL) waits
    # for the GIL the busy event loop holds until this interval forces a switch. Python's 5 ms is most of
    # a batch: the GPU idles meanwhile. Measured: benchmarks/results/S9.md and gil_interference.md.
    sys.setswitchinterval(config.gil_switch_interval_ms / 1000.0)
    if config.gc_threshold:
        # Each request allocates a few hundred short-lived objects, nearly all freed by reference
        # counting; at Python's default (a collection per 700) the collector runs thousands of times a
        # second for almost nothing. Measured on S2: about 5-10% less CPU per request.
        gc.set_threshold(config.gc_threshold)
    keep_freed_memory(config.keep_freed_memory_mb)  # (images: no page faults per buffer, see process_settings)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(serve(config, reread))
