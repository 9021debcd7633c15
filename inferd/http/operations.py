"""The operations endpoints: the models and their live figures (`GET /v1/models`, `/v1/models/{id}`,
OpenAI's list shape), the caller's rate limits (`/v1/limits`), the poison inputs isolated
(`/v1/dead-letters`, admin key), Prometheus' `/metrics`, and the process's figures a load generator
reads (`/v1/stats`). Routed by `api`, which guards the operations key where one is required."""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from ..admission.rate_limits import RateLimiter
from ..calls.context import CallContext, CallHandlers
from ..errors import InferdError, ModelNotFound
from ..models.batch_model import BatchModel
from ..observability.dead_letters import DeadLetters
from .idempotency import IdempotentReplies
from .responses import error_response, json_response

_INFINITY_CAPABILITY = {"embedding": "embed", "rerank": "rerank", "classification": "classify"}  # (its `capabilities`)


@dataclass(frozen=True, slots=True)
class ServerFigures:
    """What the operations endpoints read beside the calls' context (`CallContext`)."""

    limiter: RateLimiter  # the callers' rate limits (/v1/limits)
    dead_letters: DeadLetters  # the poison inputs isolated (/v1/dead-letters)
    registry: CollectorRegistry | None = None  # Prometheus' (None: no /metrics)
    connections: Callable[[], dict[str, int]] | None = None  # the connections' figures (/v1/stats)


class OperationsApi(CallHandlers):
    """The operations endpoints (see the module docstring)."""

    def __init__(self, context: CallContext, figures: ServerFigures, idempotency: IdempotentReplies) -> None:
        super().__init__(context)
        self.limiter = figures.limiter
        self.dead_letter_log = figures.dead_letters
        self.registry = figures.registry
        self.idempotency = idempotency
        self.connections = figures.connections
        self.created = int(time.time())  # `created` of every model in GET /v1/models (OpenAI's list shape)

    async def list_models(self, request: web.BaseRequest) -> web.StreamResponse:
        """Every model, in a shape the OpenAI client's models.list() also reads (id, object, created)."""
        data = [self._model_entry(name) for name in (*self.models.batch, *self.models.generation)]
        data += [{"created": self.created, **entry} for entry in self.models.adapter_entries()]
        return json_response({"object": "list", "data": data}, self.ids.pick(request.headers.get("X-Request-ID")))

    async def infinity_models(self, request: web.BaseRequest) -> web.StreamResponse:
        """Infinity's `GET /models`: the batch models (what Infinity serves), each with its `capabilities`
        in Infinity's words and no `owned_by` (Infinity's client takes only its own name there)."""
        data = []
        for name in self.models.batch:
            entry = self._model_entry(name)
            del entry["owned_by"]
            kind = _INFINITY_CAPABILITY.get(entry.get("output_kind") or "", "embed")
            data.append({**entry, "backend": "inferd", "capabilities": ["image_embed" if entry.get("inputs") == "image"
                                                                         and kind == "embed" else kind]})
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
