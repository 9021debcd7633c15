"""The batch models' endpoints: `POST /v1/inference` (one input, one output) and OpenAI's
`POST /v1/embeddings` (each item batched like a request of its own, answered in order).

A handler reads the body once, identifies the caller, and runs the call the one way batch calls run
(`batch_calls`): admission, then each input's own future, which the model resolves. A client that goes
away cancels the handler: its inputs still waiting are withdrawn and never computed.
"""

from __future__ import annotations

from aiohttp import web

from ..admission.admission import Admission
from ..errors import InferdError, InvalidInput, ModelNotFound
from ..lifecycle import Lifecycle
from ..messages import RequestState
from ..models.registry import Models
from ..observability.outcomes import Outcomes
from .batch_calls import BatchCalls, CallStart, cache_allowed, call_start, call_timing
from .body_reader import BodyReader
from .embeddings import embeddings_payload, parse_embeddings_body
from .generation import GenerationApi
from .inference_body import encode_vector, parse_inference_body
from .request_ids import RequestIds
from .responses import WholeResponse, dumps, error_response

_ATTACHED, _CACHED = RequestState.ATTACHED, RequestState.CACHED


class InferenceApi:
    """Handlers for the batch models (and `/v1/inference` for a generation model, handed on)."""

    def __init__(
        self, *, models: Models, admission: Admission, outcomes: Outcomes, lifecycle: Lifecycle, ids: RequestIds,
        body: BodyReader, generation: GenerationApi | None,
    ) -> None:
        self.models = models
        self.admission = admission
        self.outcomes = outcomes
        self.lifecycle = lifecycle
        self.ids = ids
        self.body = body
        self.generation = generation
        self.calls = BatchCalls(admission, outcomes)

    async def inference(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        headers = request.headers
        if start is None:
            start = call_start(self.ids, headers)
        started, request_id = start.started, start.request_id
        model_name, version, tier, tenant, items = "-", "", "-", "-", []
        try:
            who = self.admission.identify(headers)
            tier, tenant = who.tier, who.tenant
            call = parse_inference_body(await self.body.read(request))
            name = call.model or self.models.default
            model = self.models.route(name, call.version)
            if model is None:
                if self.generation is not None and name in self.models.generation:
                    return await self.generation.inference(request, self.models.generation[name], call, who, start)
                raise ModelNotFound(f"no model named {name!r}; see GET /v1/models")
            model_name, version = model.name, model.version
            items = self.calls.admit(model, start, (call.input,), who, call.timeout_ms, cache_allowed(headers))
            output = (await self.calls.answers(model, start, items, who))[0]
        except InferdError as error:
            now = self.outcomes.record_error(request_id, model_name, tier, error, started, items[0] if items else None,
                                             tenant, start.trace, version)
            return error_response(error, request_id, close=self.lifecycle.draining, held_s=now - started)
        pending = items[0]
        now = self.outcomes.record(request_id, model_name, tier, 200, "", started, pending, tenant, start.trace, version)
        batch = pending.batch
        extra: tuple[tuple[str, str], ...] = (("X-Request-ID", request_id), ("X-Model-Version", model.version))
        if batch is not None:
            timing = f"queue;dur={batch.queue_s(pending) * 1000:.3f}, compute;dur={batch.compute_s * 1000:.3f}"
            if pending.predicted_wait is not None:  # (what admission expected the queue to take)
                timing += f", predicted_queue;dur={pending.predicted_wait * 1000:.3f}"
            extra += (("Server-Timing", timing + ', shared;desc="collapsed"' if pending.state is _ATTACHED else timing),)
        elif pending.state is _CACHED:
            extra += (("Server-Timing", 'cache;desc="hit"'),)
        if call.base64:
            output = encode_vector(output, base64=True)
        payload = {"output": output, "request_id": request_id, "model": model_name, "model_version": model.version,
                   "latency_ms": round((now - started) * 1000, 3)}
        return WholeResponse(200, dumps(payload), extra)

    async def embeddings(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        """OpenAI's `POST /v1/embeddings`: each item batched like a request of its own, answered in order."""
        headers = request.headers
        if start is None:
            start = call_start(self.ids, headers)
        started, request_id = start.started, start.request_id
        model_name, version, tier, tenant, items = "-", "", "-", "-", []
        try:
            who = self.admission.identify(headers)
            tier, tenant = who.tier, who.tenant
            call = parse_embeddings_body(await self.body.read(request))
            name = call.model or self.models.default
            model = self.models.route(name)
            if model is None:
                raise ModelNotFound(f"no embedding model named {name!r}; see GET /v1/models")
            model_name, version = model.name, model.version
            if model.ready and model.output_kind != "embedding":
                raise InvalidInput(f"model {name} does not produce embeddings")
            cap = model.config.max_inputs_per_call
            if len(call.items) > cap:
                raise InvalidInput(f"`input` holds {len(call.items)} items; model {name} takes at most {cap} per call")
            items = self.calls.admit(model, start, call.items, who, call.timeout_ms, cache_allowed(headers))
            vectors = await self.calls.answers(model, start, items, who)
        except InferdError as error:
            now = self.outcomes.record_error(request_id, model_name, tier, error, started, None, tenant, start.trace, version,
                                             items[0].slo_at if items else None)
            return error_response(error, request_id, close=self.lifecycle.draining, openai=True, held_s=now - started)
        now = self.outcomes.record(request_id, model_name, tier, 200, "", started, None, tenant, start.trace, version,
                                   items[0].slo_at)
        payload = embeddings_payload(model_name, vectors, sum(item.tokens for item in items), call.base64)
        return WholeResponse(200, dumps(payload), (("X-Request-ID", request_id), ("X-Model-Version", model.version),
                                                   ("Server-Timing", call_timing(items, now - started))))
