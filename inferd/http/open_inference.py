"""The Open Inference Protocol (KServe v2) over HTTP, for batch models: health, server and model
metadata, readiness, and `POST /v2/models/{name}[/versions/{v}]/infer` (wire format in
`open_inference_wire`).

An infer call goes the way of `/v1/embeddings`: each element of its input tensor is admitted and
batched like a request of its own (so one client's tensor may span server batches), with the same
admission, tiers, deadlines (the `timeout` parameter), shared work and disconnect handling. Errors are
in the protocol's shape, `{"error": message}`, with inferd's stable `code` beside it. A path without
`/versions/{v}` gets the model's split, as `/v1/inference` does. Beside the protocol, two of Triton's
own routes that `tritonclient` calls: a model's configuration (`GET .../config`) and the repository
index (`POST /v2/repository/index`).
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from ..admission.rate_limits import Identity
from ..calls.batch_calls import BatchCalls, cache_allowed, call_timing
from ..calls.catalog import model_metadata, model_statistics, repository_index, routed_model, server_metadata, triton_config
from ..calls.context import CallContext, CallHandlers
from ..errors import InferdError, MethodNotAllowed, NotFound
from ..models.batch_model import BatchModel
from ..observability.outcomes import Call
from ..wire.json_values import dumps, json_object
from ..wire.open_inference import HEADER_LENGTH, InferBody, infer_response, parse_infer
from .body_reader import BodyReader, entered
from .call_tracing import client_of, traced
from .responses import WholeResponse, error_response


class OpenInferenceApi(CallHandlers):
    """Routes `/v2/...` paths and answers them."""

    def __init__(self, context: CallContext, body: BodyReader) -> None:
        super().__init__(context)
        self.body = body
        self.calls = BatchCalls(context.admission, context.outcomes)

    async def route(self, request: web.BaseRequest, path: str) -> web.StreamResponse:
        request_id = self.ids.pick(request.headers.get("X-Request-ID") or request.headers.get("Idempotency-Key"))
        parts = path.rstrip("/").split("/")[2:]  # (after "", "v2")
        if not _known(parts):  # (before the method: a path that is no route is a 404 whatever the method)
            return error_v2(NotFound(f"no route for {request.method} {path}"), request_id)
        method = "POST" if parts[-1:] == ["infer"] or parts == ["repository", "index"] else "GET"
        if request.method != method:
            return error_v2(MethodNotAllowed(f"{path} accepts {method} only"), request_id, allow=method)
        try:
            if not parts:
                return _json(server_metadata(), request_id)
            if parts[0] == "health" and len(parts) == 2 and parts[1] in ("live", "ready"):
                ok = True if parts[1] == "live" else self.lifecycle.serving and self.models.ready
                return _json({parts[1]: ok}, request_id, 200 if ok else 503)
            if parts == ["repository", "index"]:
                if self.admission.auth.config.operations != "open":
                    self.admission.auth.require_operations(request.headers)
                ready_only = (json_object(await self.body.read(request)) if request.can_read_body else {}).get("ready")
                return WholeResponse(200, dumps(repository_index(self.models, ready_only is True)), (("X-Request-ID", request_id),))
            if parts[0] != "models" or len(parts) < 2:
                raise NotFound(f"no route for {request.method} {path}")
            # The caller first: an unauthenticated one learns nothing of which models and versions exist.
            who = None
            if parts[-1] == "infer":
                who = self.admission.identify(request.headers)
            elif self.admission.auth.config.operations != "open":
                self.admission.auth.require_operations(request.headers)  # (as GET /v1/models)
            model, rest = self._model(parts[1:])
            if not rest:
                return _json(model_metadata(self.models, model), request_id)
            if rest == ["ready"]:
                return _json({"name": model.name, "ready": model.ready}, request_id, 200 if model.ready else 503)
            if rest == ["config"]:
                return _json(triton_config(model), request_id)
            if rest == ["stats"]:
                return _json({"model_stats": [model_statistics(model, self.outcomes.metrics)]}, request_id)
            if rest == ["infer"] and who is not None:  # (identified above)
                entered(self.lifecycle, request)
                infer = V2Infer(self.started(model, request_id), model, who)
                infer.call.client = client_of(request)  # (the connection, as the batcher's echo knows it)
                try:
                    return await self.infer(request, infer)
                finally:
                    self.lifecycle.leave()
            raise NotFound(f"no route for {request.method} {path}")
        except InferdError as error:
            return error_v2(error, request_id)

    def _model(self, parts: list[str]) -> tuple[BatchModel, list[str]]:
        name, rest, version = parts[0], parts[1:], None
        if rest[:1] == ["versions"]:
            if len(rest) < 2:
                raise NotFound(f"no route for /v2/models/{name}/versions")
            version, rest = rest[1], rest[2:]
        return routed_model(self.models, name, version), rest

    @staticmethod
    def started(model: BatchModel, request_id: str) -> Call:
        """An infer call's record, from now."""
        return Call(time.monotonic(), request_id, model=model.name, version=model.version)

    async def infer(self, request: web.BaseRequest, infer: V2Infer) -> web.StreamResponse:
        if self.tracing is None:
            return await self._infer(request, infer)
        return await traced(self.tracing, request, infer.call, lambda _: self._infer(request, infer), TRACED_ROUTE)

    async def _infer(self, request: web.BaseRequest, infer: V2Infer) -> web.StreamResponse:
        try:
            self.take(infer, await self.body.read(request), request.headers)
            outputs = await self.calls.answers(infer.model, infer.call)
        except InferdError as error:
            return self.refused(infer, error)
        body, headers, content_type = self.answered(infer, outputs)
        return WholeResponse(200, body, headers, content_type=content_type)

    # The steps of `_infer`, which the connection's fast path (`fast_path`) takes too.

    def take(self, infer: V2Infer, body: bytes, headers: Mapping[str, str]) -> None:
        """Read the call from the body and admit its inputs (`infer.call.requests`)."""
        model, call, who = infer.model, infer.call, infer.who
        call.tier, call.tenant = who.tier, who.tenant
        infer.parsed = parsed = parse_infer(body, headers.get(HEADER_LENGTH), model.input_kind == "image",
                                            model.config.max_inputs_per_call)
        self.calls.admit(model, call, parsed.inputs, who, parsed.timeout_ms, cache_allowed(headers))

    def refused(self, infer: V2Infer, error: InferdError) -> WholeResponse:
        """The call's error answer in the protocol's shape, recorded."""
        call = infer.call
        now = self.outcomes.record_error(call, error)
        return error_response(error, call.request_id, close=self.lifecycle.draining, open_inference=True,
                              held_s=now - call.started)

    def answered(self, infer: V2Infer, outputs: list[Any]) -> tuple[bytes, tuple[tuple[str, str], ...], bytes]:
        """The call's answer (its body, headers and content type), recorded."""
        call, parsed = infer.call, infer.parsed
        assert parsed is not None  # (read by `take`)
        now = self.outcomes.record(call)
        body, header_length = infer_response(call.model, call.version, parsed.id, outputs, parsed.binary_output)
        headers = (("X-Request-ID", call.request_id), ("Server-Timing", call_timing(call.requests, now - call.started)))
        if header_length is None:
            return body, headers, b"application/json"
        return body, (*headers, (HEADER_LENGTH, str(header_length))), b"application/octet-stream"


TRACED_ROUTE = "/v2/models/{model}/infer"


@dataclass(slots=True)
class V2Infer:
    """An infer call as far as it got: its record (model and version routed), the caller, the body."""

    call: Call
    model: BatchModel
    who: Identity
    parsed: InferBody | None = None


def error_v2(error: InferdError, request_id: str, *, close: bool = False, allow: str | None = None) -> WholeResponse:
    return error_response(error, request_id, close=close, allow=allow, open_inference=True)


def _json(payload: dict[str, Any], request_id: str, status: int = 200) -> WholeResponse:
    return WholeResponse(status, dumps(payload), (("X-Request-ID", request_id),))


def _known(parts: list[str]) -> bool:
    """Whether a path under /v2 (its parts after "v2") has the shape of one of the protocol's routes."""
    if not parts or parts == ["repository", "index"]:
        return True
    if parts[0] == "health":
        return len(parts) == 2 and parts[1] in ("live", "ready")
    if parts[0] != "models" or len(parts) < 2:
        return False
    rest = parts[2:]
    if rest[:1] == ["versions"]:
        rest = rest[2:] if len(rest) >= 2 else ["?"]
    return rest in ([], ["ready"], ["config"], ["stats"], ["infer"])
