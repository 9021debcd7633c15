"""The HTTP layer: routes, the inference handler, and JSON errors.

Every response is JSON and carries `X-Request-ID`. This runs on aiohttp's low-level server with a
dict of exact paths for routing: the Application layer (URL dispatcher, match info, middleware chain)
cost about a tenth of the CPU per request, and a handful of fixed paths need none of it.
"""

from __future__ import annotations

import asyncio
import math
import resource
import time
from typing import Any, Awaitable, Callable

from aiohttp import web

from .admission import Admission
from .errors import InferdError, MethodNotAllowed, ModelNotFound, NotFound, PayloadTooLarge
from .lifecycle import Lifecycle
from .protocol import RequestIds, dumps, parse_inference_body
from .served_model import ServedModel

JSON = "application/json"
Handler = Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]


def error_response(error: InferdError, request_id: str, *, close: bool = False) -> web.Response:
    payload: dict[str, Any] = {"error": error.code, "message": error.message, "request_id": request_id}
    headers = {"Content-Type": JSON, "X-Request-ID": request_id}
    if error.retry_after_ms is not None:
        payload["retry_after_ms"] = error.retry_after_ms
        headers["Retry-After"] = str(max(1, math.ceil(error.retry_after_ms / 1000)))
    response = web.Response(body=dumps(payload), status=error.status, headers=headers)
    if close:
        response.force_close()
    return response


def json_response(payload: Any, request_id: str, status: int = 200) -> web.Response:
    return web.Response(body=dumps(payload), status=status, headers={"Content-Type": JSON, "X-Request-ID": request_id})


class HttpApi:
    def __init__(
        self,
        *,
        models: dict[str, ServedModel],
        default_model: str,
        admission: Admission,
        lifecycle: Lifecycle,
        max_body_bytes: int,
    ) -> None:
        self.models = models
        self.default_model = default_model
        self.admission = admission
        self.lifecycle = lifecycle
        self.max_body_bytes = max_body_bytes
        self.ids = RequestIds()

        self.routes: dict[str, tuple[str, Handler]] = {
            "/v1/inference": ("POST", self.inference),
            "/api/inference": ("POST", self.inference),
            "/healthz": ("GET", self.healthz),
            "/readyz": ("GET", self.readyz),
            "/v1/models": ("GET", self.list_models),
            "/v1/stats": ("GET", self.stats),
        }

    async def handle(self, request: web.BaseRequest) -> web.StreamResponse:
        """The low-level server's one handler: route by exact path, then method."""
        route = self.routes.get(request.path)
        if route is not None and route[0] == request.method:
            return await route[1](request)
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        if route is None:
            return error_response(NotFound(f"no route for {request.method} {request.path}"), request_id)
        response = error_response(MethodNotAllowed(f"{request.path} accepts {route[0]} only"), request_id)
        response.headers["Allow"] = route[0]
        return response

    # ---- inference -------------------------------------------------------------------------------

    async def inference(self, request: web.BaseRequest) -> web.Response:
        started = time.monotonic()
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        lifecycle = self.lifecycle
        lifecycle.enter()
        try:
            self.admission.check_open()
            try:
                body = await request.read()
            except web.HTTPRequestEntityTooLarge:
                raise PayloadTooLarge(f"body exceeds {self.max_body_bytes} bytes") from None
            call = parse_inference_body(body)
            model = self.models.get(call.model or self.default_model)
            if model is None:
                raise ModelNotFound(f"no model named {call.model!r}; see GET /v1/models")
            pending = self.admission.admit(model, call, request_id)
            try:
                output = await pending.future
            except asyncio.CancelledError:
                model.abandon(pending)  # client went away: never computed if still queued
                raise
        except InferdError as error:
            return error_response(error, request_id, close=lifecycle.draining)
        finally:
            lifecycle.leave()
        now = time.monotonic()
        batch = pending.batch
        headers = {"Content-Type": JSON, "X-Request-ID": request_id}
        if batch is not None:
            headers["Server-Timing"] = (
                f"queue;dur={(batch.started_at - pending.enqueued_at) * 1000:.3f}, "
                f"compute;dur={batch.compute_s * 1000:.3f}"
            )
        payload = {
            "output": output,
            "request_id": request_id,
            "model": model.name,
            "latency_ms": round((now - started) * 1000, 3),
        }
        return web.Response(body=dumps(payload), headers=headers)

    # ---- operations ------------------------------------------------------------------------------

    async def healthz(self, request: web.BaseRequest) -> web.Response:
        return json_response({"status": "ok"}, self.ids.pick(request.headers.get("X-Request-ID")))

    async def readyz(self, request: web.BaseRequest) -> web.Response:
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        models = {name: _readiness(m) for name, m in self.models.items()}
        ready = not self.lifecycle.draining and all(m.ready for m in self.models.values())
        payload = {"ready": ready, "phase": self.lifecycle.phase.value, "models": models}
        return json_response(payload, request_id, status=200 if ready else 503)

    async def list_models(self, request: web.BaseRequest) -> web.Response:
        data = [m.describe() for m in self.models.values()]
        return json_response({"object": "list", "data": data}, self.ids.pick(request.headers.get("X-Request-ID")))

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
    state: dict[str, Any] = {"ready": model.ready, "ready_workers": model.ready_workers, "workers": len(model.workers)}
    if model.start_error is not None:
        state["error"] = f"{type(model.start_error).__name__}: {model.start_error}"[:300]
    return state


def _current_rss_bytes() -> int | None:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except (OSError, ValueError, IndexError):
        return None
