"""The HTTP layer: routes, the inference handler, and JSON errors.

Every response is JSON and carries `X-Request-ID`. This runs on aiohttp's low-level server with a
dict of exact paths for routing: the Application layer (URL dispatcher, match info, middleware chain)
cost about a tenth of the CPU per request, and a handful of fixed paths need none of it.
"""

from __future__ import annotations

import asyncio
import resource
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import orjson
from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .access_log import AccessLog
from .admission import Admission
from .auth import Authenticator
from .embeddings import embeddings_payload, parse_embeddings_body
from .errors import (
    InferdError,
    InvalidInput,
    MethodNotAllowed,
    ModelNotFound,
    NotFound,
    PayloadTooLarge,
)
from .faults import DeadLetters
from .lifecycle import Lifecycle
from .messages import PendingRequest
from .metrics import RequestMetrics
from .protocol import RequestIds, encode_vector, parse_inference_body
from .rate_limits import RateLimiter
from .responses import WholeResponse, dumps, error_response, json_response
from .served_model import ServedModel

if TYPE_CHECKING:
    from .generation import GenerationModel

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


class HttpApi:
    def __init__(
        self,
        *,
        models: dict[str, ServedModel],
        generators: dict[str, GenerationModel],
        default_model: str,
        admission: Admission,
        lifecycle: Lifecycle,
        max_body_bytes: int,
        metrics: RequestMetrics | None,
        registry: CollectorRegistry | None,
        access_log: AccessLog,
        auth: Authenticator,
        limiter: RateLimiter,
        dead_letters: DeadLetters,
    ) -> None:
        self.models = models
        self.generators = generators
        self.default_model = default_model
        self.admission = admission
        self.lifecycle = lifecycle
        self.max_body_bytes = max_body_bytes
        self.ids = RequestIds()
        self.created = int(time.time())  # `created` of every model in GET /v1/models (OpenAI's list shape)
        self.metrics = metrics
        self.registry = registry
        self.access_log = access_log
        self.auth = auth
        self.limiter = limiter
        self.dead_letter_log = dead_letters

        self.routes: dict[str, tuple[str, Handler]] = {
            "/v1/inference": ("POST", self.inference),
            "/api/inference": ("POST", self.inference),
            "/v1/embeddings": ("POST", self.embeddings),
            "/healthz": ("GET", self.healthz),
            "/readyz": ("GET", self.readyz),
            "/v1/models": ("GET", self.list_models),
            "/v1/stats": ("GET", self.stats),
            "/v1/dead-letters": ("GET", self.dead_letters),
            "/v1/limits": ("GET", self.limits),
        }
        if registry is not None:
            self.routes["/metrics"] = ("GET", self.prometheus)
        self.generation = None
        if generators:
            from .http_generation import GenerationApi

            self.generation = GenerationApi(
                models=generators, admission=admission, auth=auth,
                tier_priority={t: -p for t, p in admission.tier_priorities.items()},
                max_body_bytes=max_body_bytes, record=self._record_simple, error_response=error_response,
                pick_id=self.ids.pick,
            )
            self.routes["/v1/completions"] = ("POST", self._counted(self.generation.completions))
            self.routes["/v1/chat/completions"] = ("POST", self._counted(self.generation.chat_completions))

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """The low-level server's one handler: route by exact path, then method."""
        route = self.routes.get(request.path)
        if route is not None and route[0] == request.method:
            return await route[1](request)
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        if route is None:
            return error_response(NotFound(f"no route for {request.method} {request.path}"), request_id)
        return error_response(MethodNotAllowed(f"{request.path} accepts {route[0]} only"), request_id, allow=route[0])

    # ---- inference -------------------------------------------------------------------------------

    async def inference(self, request: web.BaseRequest) -> web.StreamResponse:
        started = time.monotonic()
        headers = request.headers
        request_id = self.ids.pick(headers.get("X-Request-ID") or headers.get("Idempotency-Key"))
        lifecycle = self.lifecycle
        lifecycle.enter()
        model_name, tier, pending = "-", "-", None
        try:
            who = self.auth.identify(headers)
            tier = who.tier
            body = await self.read_body(request)
            call = parse_inference_body(body)
            name = call.model or self.default_model
            model = self.models.get(name)
            if model is None:
                if self.generation is not None and name in self.generators:
                    return await self.generation.inference(request, self.generators[name], orjson.loads(body), request_id, started)
                raise ModelNotFound(f"no model named {name!r}; see GET /v1/models")
            model_name = name
            pending = self.admission.admit(model, request_id, call.input, who, call.timeout_ms)
            try:
                output = await pending.future
            except asyncio.CancelledError:
                model.abandon(pending)  # client went away: never computed if still queued
                self._record(request_id, model_name, tier, 499, "CLIENT_DISCONNECTED", started, pending)
                raise
        except InferdError as error:
            if error.status in (429, 503) and self.metrics is not None:
                self.metrics.shed[(model_name, tier, error.reason)] += 1
            self._record(request_id, model_name, tier, error.status, error.code, started, pending)
            return error_response(error, request_id, close=lifecycle.draining)
        finally:
            lifecycle.leave()
        now = self._record(request_id, model_name, tier, 200, "", started, pending)
        batch = pending.batch
        headers: tuple[tuple[str, str], ...] = (("X-Request-ID", request_id),)
        if batch is not None:
            headers += (("Server-Timing", f"queue;dur={(batch.started_at - pending.enqueued_at) * 1000:.3f}, "
                                          f"compute;dur={batch.compute_s * 1000:.3f}"),)
        if call.base64:
            output = encode_vector(output, base64=True)
        payload = {
            "output": output,
            "request_id": request_id,
            "model": model_name,
            "latency_ms": round((now - started) * 1000, 3),
        }
        return WholeResponse(200, dumps(payload), headers)

    async def embeddings(self, request: web.BaseRequest) -> web.StreamResponse:
        """OpenAI's `POST /v1/embeddings`: each item batched like a request of its own, answered in order."""
        started = time.monotonic()
        headers = request.headers
        request_id = self.ids.pick(headers.get("X-Request-ID") or headers.get("Idempotency-Key"))
        lifecycle = self.lifecycle
        lifecycle.enter()
        model_name, tier, model, items = "-", "-", None, []
        try:
            who = self.auth.identify(headers)
            tier = who.tier
            call = parse_embeddings_body(await self.read_body(request))
            name = call.model or self.default_model
            model = self.models.get(name)
            if model is None:
                raise ModelNotFound(f"no embedding model named {name!r}; see GET /v1/models")
            model_name = name
            if model.ready and model.output_kind != "embedding":
                raise InvalidInput(f"model {name} does not produce embeddings")
            cap = model.config.max_inputs_per_call
            if len(call.items) > cap:
                raise InvalidInput(f"`input` holds {len(call.items)} items; model {name} takes at most {cap} per call")
            items = self.admission.admit_many(model, request_id, call.items, who, call.timeout_ms)
            try:
                vectors = await asyncio.gather(*(item.future for item in items))
            except asyncio.CancelledError:
                self._record(request_id, model_name, tier, 499, "CLIENT_DISCONNECTED", started, None)
                raise
        except InferdError as error:
            if error.status in (429, 503) and self.metrics is not None:
                self.metrics.shed[(model_name, tier, error.reason)] += 1
            self._record(request_id, model_name, tier, error.status, error.code, started, None)
            return error_response(error, request_id, close=lifecycle.draining, openai=True)
        finally:
            lifecycle.leave()
            for item in items:  # the rest of a call that failed or was given up: never computed if still queued
                if not item.future.done() or item.future.cancelled():  # (a cancelled gather cancels them)
                    model.abandon(item)  # type: ignore[union-attr]
        self._record(request_id, model_name, tier, 200, "", started, None)
        payload = embeddings_payload(model_name, vectors, sum(item.tokens for item in items), call.base64)
        return WholeResponse(200, dumps(payload), (("X-Request-ID", request_id),))

    async def read_body(self, request: web.BaseRequest) -> bytes:
        """The whole body, at most `max_body_bytes`. A small body has usually arrived with the headers:
        then it is taken from the buffer at once, without the two awaits of `request.read()`."""
        content = request.content
        if content.is_eof():
            body = content.read_nowait()
        else:
            parts = bytearray(content.read_nowait())
            while not content.is_eof() and len(parts) <= self.max_body_bytes:
                parts += await content.readany()
            body = bytes(parts)
        if len(body) > self.max_body_bytes:
            raise PayloadTooLarge(f"body exceeds {self.max_body_bytes} bytes")
        return body

    def _counted(self, handler: Handler) -> Handler:
        """Count a handler's requests as in flight, so a drain waits for them too."""
        lifecycle = self.lifecycle

        async def counted(request: web.BaseRequest) -> web.StreamResponse:
            lifecycle.enter()
            try:
                return await handler(request)
            finally:
                lifecycle.leave()

        return counted

    def _record_simple(self, request_id: str, model: str, tier: str, status: int, error: str, started: float) -> None:
        self._record(request_id, model, tier, status, error, started, None)

    def _record(
        self, request_id: str, model: str, tier: str, status: int, error: str, started: float, pending: PendingRequest | None
    ) -> float:
        """Count the outcome and the stage times, and maybe log it; returns the time it was done."""
        now = time.monotonic()
        metrics = self.metrics
        if metrics is not None:
            metrics.requests[(model, tier, status, error)] += 1
            metrics.duration[model].observe(now - started)
            if pending is not None:
                metrics.admission[model].observe(pending.enqueued_at - started)
                if pending.batch is not None and status == 200:
                    metrics.response[model].observe(now - pending.batch.finished_at)
        if self.access_log.wants(status):
            self.access_log.record(request_id, model, tier, status, error, now - started, pending)
        return now

    # ---- operations ------------------------------------------------------------------------------

    async def healthz(self, request: web.BaseRequest) -> web.Response:
        return json_response({"status": "ok"}, self.ids.pick(request.headers.get("X-Request-ID")))

    async def readyz(self, request: web.BaseRequest) -> web.Response:
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        models = {name: _readiness(m) for name, m in self.models.items()}
        for name, g in self.generators.items():
            models[name] = {"ready": g.ready, "kind": "generation"}
            if g.start_error is not None:
                models[name]["error"] = f"{type(g.start_error).__name__}: {g.start_error}"[:300]
        ready = self.lifecycle.serving and all(m.ready for m in (*self.models.values(), *self.generators.values()))
        payload = {"ready": ready, "phase": self.lifecycle.phase.value, "models": models}
        return json_response(payload, request_id, status=200 if ready else 503)

    async def list_models(self, request: web.BaseRequest) -> web.Response:
        """Every model, in a shape the OpenAI client's models.list() also reads (id, object)."""
        data = [{"id": m.name, "object": "model", "created": self.created, "owned_by": "inferd", "kind": "batch",
                 **m.describe()} for m in self.models.values()]
        data += [g.describe() for g in self.generators.values()]
        return json_response({"object": "list", "data": data}, self.ids.pick(request.headers.get("X-Request-ID")))

    async def limits(self, request: web.BaseRequest) -> web.Response:
        """The caller's tier, and per model its rate limit now (scaled by capacity) and what is left."""
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        try:
            who = self.auth.identify(request.headers)
        except InferdError as error:
            return error_response(error, request_id)
        now = time.monotonic()
        models = {}
        for name, model in self.models.items():
            scale = model.capacity_scale()
            remaining = self.limiter.remaining(who, name, scale, now)
            models[name] = {
                "rate_per_s": None if who.rate_per_s is None else round(who.rate_per_s * scale, 3),
                "nominal_rate_per_s": who.rate_per_s,
                "burst": who.burst,
                "remaining": None if remaining is None else round(remaining, 3),
                "capacity_scale": round(scale, 3),
            }
        return json_response({"tenant": who.tenant, "tier": who.tier, "models": models}, request_id)

    async def dead_letters(self, request: web.BaseRequest) -> web.Response:
        """Poison inputs isolated by bisection (admin only): ids, hashes and lengths, never the inputs."""
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        try:
            self.auth.require_admin(request.headers)
        except InferdError as error:
            return error_response(error, request_id)
        log = self.dead_letter_log
        return json_response({"total": log.total, "entries": log.entries()}, request_id)

    async def prometheus(self, request: web.BaseRequest) -> web.Response:
        """Prometheus text format, rendered by prometheus-client from this server's registry."""
        body = generate_latest(self.registry)  # type: ignore[arg-type]
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})

    async def stats(self, request: web.BaseRequest) -> web.Response:
        """Process-level figures a load generator reads before and after a run."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        payload = {
            "process": {
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                "max_rss_bytes": usage.ru_maxrss * 1024,
                "rss_bytes": _current_rss_bytes(),
                "in_flight": self.lifecycle.in_flight,
            },
            "models": {name: m.describe()["stats"] for name, m in self.models.items()},
        }
        return json_response(payload, self.ids.pick(request.headers.get("X-Request-ID")))


def _readiness(model: ServedModel) -> dict[str, Any]:
    state: dict[str, Any] = {
        "ready": model.ready,
        "ready_workers": model.ready_workers,
        "workers": len(model.workers),
        "breaker": model.breaker.state.value,
    }
    if model.start_error is not None:
        state["error"] = f"{type(model.start_error).__name__}: {model.start_error}"[:300]
    return state


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None
