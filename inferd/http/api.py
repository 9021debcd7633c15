"""The HTTP surface: one route table over aiohttp's low-level server, and the operations endpoints.

aiohttp's Application layer (URL dispatcher, match info, middleware chain) cost about a tenth of the CPU
per request; a handful of fixed paths need none of it, so routing is a dict of exact paths. Requests
that compute something are counted as in flight for the whole handler, so a drain waits for them.
Every response is JSON (but /metrics) and carries `X-Request-ID`.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Awaitable, Callable
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from .. import __version__
from ..admission.admission import Admission
from ..admission.rate_limits import RateLimiter
from ..errors import InferdError, MethodNotAllowed, ModelNotFound, NotFound
from ..lifecycle import Lifecycle
from ..models.batch_model import BatchModel
from ..models.registry import Models
from ..models.rollout import Rollouts
from ..observability.dead_letters import DeadLetters
from ..observability.outcomes import Outcomes
from ..observability.tracing import Tracing
from .about import AboutApi
from .admin import PREFIX as ADMIN_PREFIX
from .admin import AdminApi
from .api_page import PAGE_FILES, ApiPage
from .batch_calls import CallHandler, traced_route
from .body_reader import BodyReader
from .fast_path import FastPath
from .generation import GenerationApi
from .idempotency import IdempotentReplies
from .inference import InferenceApi
from .open_inference import OpenInferenceApi
from .openapi import openapi_document
from .request_ids import RequestIds
from .responses import WholeResponse, dumps, error_response, json_response, openai_path
from .tokens import TokensApi

Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


_KEYED_PATHS = ("/v1/inference", "/api/inference", "/v1/embeddings", "/v1/rerank", "/rerank", "/embed", "/v2/embed",
                "/v1/classify", "/predict")
_INFERD_ERRORS = ("/v1/inference", "/api/inference", "/v1/rerank", "/rerank", "/embed", "/v2/embed", "/predict")  # (the other keyed paths: OpenAI's)
_GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")


class HttpApi:
    """Routes requests to the inference, embeddings and generation handlers, and answers the
    operations endpoints (health, readiness, models, limits, stats, dead letters, metrics)."""

    def __init__(
        self, *, models: Models, admission: Admission, lifecycle: Lifecycle, outcomes: Outcomes, limiter: RateLimiter,
        dead_letters: DeadLetters, registry: CollectorRegistry | None, body: BodyReader,
        connections: Callable[[], dict[str, int]] | None = None, idempotency_window_s: float = 0.0,
        idempotency_max_keys: int = 1, idempotency_max_bytes: int = 64 << 20, tracing: Tracing | None = None,
        rollouts: Rollouts | None = None, fast_path: bool = True,
        file_drift: Callable[[], dict[str, Any]] | None = None,
    ) -> None:
        self.models = models
        self.admission = admission
        self.lifecycle = lifecycle
        self.limiter = limiter
        self.dead_letter_log = dead_letters
        self.registry = registry
        self.connections = connections
        self.ids = RequestIds()
        self.created = int(time.time())  # `created` of every model in GET /v1/models (OpenAI's list shape)
        generation = None
        if models.generation:
            generation = GenerationApi(models=models, admission=admission, outcomes=outcomes,
                                       lifecycle=lifecycle, ids=self.ids, body=body)
        inference = InferenceApi(models=models, admission=admission, outcomes=outcomes, lifecycle=lifecycle, ids=self.ids,
                                 body=body, generation=generation)
        self.fast_path = FastPath(inference, lifecycle, tracing) if fast_path else None  # (answers from the connection)
        untraced: tuple[CallHandler, ...] = (inference.inference, inference.embeddings, inference.rerank,
                                             inference.tei_rerank, inference.tei_embed, inference.cohere_embed,
                                             inference.classify, inference.tei_predict)
        call_routes: tuple[Handler, ...] = untraced if tracing is None else tuple(
            traced_route(tracing, self.ids, route) for route in untraced)
        self.open_inference = OpenInferenceApi(models=models, admission=admission, outcomes=outcomes, lifecycle=lifecycle,
                                               ids=self.ids, body=body, tracing=tracing)
        self.admin = AdminApi(rollouts=rollouts, auth=admission.auth, body=body, ids=self.ids,
                              file_drift=file_drift) if rollouts else None
        self.idempotency = IdempotentReplies(admission.auth, body, self.ids, idempotency_window_s, idempotency_max_keys,
                                             idempotency_max_bytes)
        keyed = self.idempotency.wrap
        about = AboutApi(models, self.ids, lifecycle, lambda: self.ready)
        tokens = TokensApi(models=models, admission=admission, ids=self.ids, body=body)
        # path -> (method, handler, counted as in flight)
        self.routes: dict[str, tuple[str, Handler, bool]] = {
            "/v1/inference": ("POST", call_routes[0], True),
            "/api/inference": ("POST", call_routes[0], True),
            "/v1/embeddings": ("POST", call_routes[1], True),
            "/v1/rerank": ("POST", call_routes[2], True),
            "/rerank": ("POST", call_routes[3], True),
            "/embed": ("POST", call_routes[4], True),
            "/v2/embed": ("POST", call_routes[5], True),
            "/v1/classify": ("POST", call_routes[6], True),
            "/predict": ("POST", call_routes[7], True),
            "/tokenize": ("POST", tokens.tokenize, True), "/decode": ("POST", tokens.decode, True),
            "/healthz": ("GET", about.healthz, False),
            "/readyz": ("GET", about.readyz, False),
            "/health": ("GET", about.health, False), "/version": ("GET", about.version, False),
            "/info": ("GET", about.info, False),
            "/v1/models": ("GET", self.list_models, False),
            "/v1/stats": ("GET", self.stats, False),
            "/v1/dead-letters": ("GET", self.dead_letters, False),
            "/v1/limits": ("GET", self.limits, False),
        }
        if registry is not None:
            self.routes["/metrics"] = ("GET", self.prometheus, False)
        if generation is not None:
            completions: Handler = generation.completions
            chat: Handler = generation.chat_completions
            if tracing is not None:
                completions = traced_route(tracing, self.ids, generation.completions)
                chat = traced_route(tracing, self.ids, generation.chat_completions)
            self.routes["/v1/completions"] = ("POST", completions, True)
            self.routes["/v1/chat/completions"] = ("POST", chat, True)
        # A request with an Idempotency-Key goes through the replies' wrapper (only those: no frame for the rest).
        self._keyed: dict[str, Handler] = {} if idempotency_window_s <= 0 else {
            path: keyed(self.routes[path][1], join=path not in _GENERATION_PATHS, openai=path not in _INFERD_ERRORS)
            for path in (*_KEYED_PATHS, *_GENERATION_PATHS) if path in self.routes}
        self.routes["/openapi.json"] = ("GET", self.openapi, False)
        page = ApiPage()  # /docs: the document as an interactive page
        self.routes["/docs"] = ("GET", page.page, False)
        self.routes.update({path: ("GET", page.asset, False) for path in PAGE_FILES})
        self._model_route: Handler = self.model  # GET /v1/models/{id}: the one path with a parameter
        self._openapi = dumps(openapi_document(self.routes, __version__))
        if admission.auth.config.operations != "open":
            for path in ("/metrics", "/v1/stats", "/v1/models"):
                if path in self.routes:
                    method, handler, counted = self.routes[path]
                    self.routes[path] = (method, self._operations_only(handler), counted)
            self._model_route = self._operations_only(self.model)

    @property
    def ready(self) -> bool:
        """Should load balancers send traffic here: serving, and every model ready."""
        return self.lifecycle.serving and self.models.ready

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """The low-level server's one handler: route by exact path, then method. The path as sent, not
        percent-decoded: `/%6Detrics` is not `/metrics`, so a proxy's rule on a path holds here too."""
        path = request.raw_path
        if "?" in path:
            path = path.partition("?")[0]
        if path[:1] != "/":  # the absolute form, as a proxy may send it: its path, still as sent
            path = request.rel_url.raw_path
        route = self.routes.get(path)
        if route is not None and route[0] == request.method:
            if not route[2]:
                return await route[1](request)
            lifecycle = self.lifecycle
            handler = route[1]
            if self._keyed and "Idempotency-Key" in request.headers:
                handler = self._keyed.get(path, handler)
            lifecycle.enter()
            try:
                return await handler(request)
            finally:
                lifecycle.leave()
        if route is None and self.admin is not None and path.startswith(ADMIN_PREFIX):
            return await self.admin.route(request, path)
        if route is None and (path == "/v2" or path.startswith("/v2/")):
            return await self.open_inference.route(request, path)  # (its own routes, in its own error shape)
        if route is None and path.startswith("/v1/models/"):
            if request.method == "GET":
                return await self._model_route(request)
            route = ("GET", self.model, False)  # (for the 405 below)
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        openai = openai_path(path)
        if route is None:
            error: InferdError = NotFound(f"no route for {request.method} {path}")
            if path in _GENERATION_PATHS:
                error = ModelNotFound(f"this server serves no generation model: {path} has nothing to answer; see GET /v1/models")
            return error_response(error, request_id, openai=openai)
        return error_response(MethodNotAllowed(f"{path} accepts {route[0]} only"), request_id, allow=route[0], openai=openai)

    def _operations_only(self, handler: Handler) -> Handler:
        async def guarded(request: web.BaseRequest) -> web.StreamResponse:
            try:
                self.admission.auth.require_operations(request.headers)
            except InferdError as error:
                return error_response(error, self.ids.pick(request.headers.get("X-Request-ID")),
                                      openai=openai_path(request.rel_url.raw_path))
            return await handler(request)
        return guarded

    # ---- operations ------------------------------------------------------------------------------

    async def list_models(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every model, in a shape the OpenAI client's models.list() also reads (id, object, created)."""
        data = [self._model_entry(name) for name in (*self.models.batch, *self.models.generation)]
        data += [{"created": self.created, **entry} for entry in self.models.adapter_entries()]
        return json_response({"object": "list", "data": data}, self.ids.pick(request.headers.get("X-Request-ID")))

    async def model(self, request: web.BaseRequest) -> web.StreamResponse:
        """`GET /v1/models/{id}`: one model, as the OpenAI client's models.retrieve() reads it."""
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        name = request.rel_url.raw_path.removeprefix("/v1/models/")  # (as sent; in absolute form too)
        if name not in self.models.batch and name not in self.models.generation:
            adapter = next((entry for entry in self.models.adapter_entries() if entry["id"] == name), None)
            if adapter is not None:
                return json_response({"created": self.created, **adapter}, request_id)
            return error_response(ModelNotFound(f"no model named {name!r}; see GET /v1/models"), request_id, openai=True)
        return json_response(self._model_entry(name), request_id)

    def _model_entry(self, name: str) -> dict[str, Any]:
        batch = self.models.batch.get(name)
        if batch is not None:
            served = self.models.served[name]
            versions = {v: {"state": f.state.value, "traffic": served.traffic.get(v, 0.0), **f.model.describe()}
                        for v, f in served.versions.items() if f.model is not batch}
            return {"id": name, "object": "model", "created": self.created, "owned_by": "inferd", "kind": "batch",
                    **batch.describe(), "default_version": served.default, "traffic": served.traffic,
                    "other_versions": versions}
        return {"created": self.created, **self.models.generation[name].describe()}

    async def limits(self, request: web.BaseRequest) -> web.StreamResponse:
        """The caller's tier, and per model its rate limit now (scaled by capacity) and what is left."""
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        try:
            who = self.admission.identify(request.headers)
        except InferdError as error:
            return error_response(error, request_id)
        now = time.monotonic()
        models = {}
        for name, model in self.models.batch.items():
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

    async def dead_letters(self, request: web.BaseRequest) -> web.StreamResponse:
        """Poison inputs isolated by bisection (admin only): ids, hashes and lengths, never the inputs."""
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        try:
            self.admission.auth.require_admin(request.headers)
        except InferdError as error:
            return error_response(error, request_id)
        log = self.dead_letter_log
        return json_response({"total": log.total, "entries": log.entries()}, request_id)

    async def openapi(self, request: web.BaseRequest) -> web.StreamResponse:
        """This server's OpenAPI 3.1 document (`openapi.py`)."""
        return WholeResponse(200, self._openapi, (("X-Request-ID", self.ids.pick(request.headers.get("X-Request-ID"))),))

    async def prometheus(self, request: web.BaseRequest) -> web.StreamResponse:
        """Prometheus text format, rendered by prometheus-client from this server's registry."""
        body = generate_latest(self.registry)  # type: ignore[arg-type]
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST, "Server": "inferd"})

    async def stats(self, request: web.BaseRequest) -> web.StreamResponse:
        """Process-level figures a load generator reads before and after a run."""
        usage = resource.getrusage(resource.RUSAGE_SELF)
        payload = {
            "process": {
                "cpu_seconds": usage.ru_utime + usage.ru_stime,
                "max_rss_bytes": usage.ru_maxrss * 1024,
                "rss_bytes": _current_rss_bytes(),
                "in_flight": self.lifecycle.in_flight,
            },
            "connections": self.connections() if self.connections is not None else None,
            "idempotency": {"keys": self.idempotency.keys, "bytes": self.idempotency.held_bytes, "replays": self.idempotency.replays},
            "models": {_instance_key(m, self.models.batch): m.describe()["stats"] for m in self.models.instances()},
        }
        return json_response(payload, self.ids.pick(request.headers.get("X-Request-ID")))


def _instance_key(model: BatchModel, defaults: dict[str, BatchModel]) -> str:
    """A version's key in /v1/stats: the model's name for its default version, `name@version` for others."""
    return model.name if defaults.get(model.name) is model else f"{model.name}@{model.version}"


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None
