"""The batch models' endpoints: `POST /v1/inference` (one input, one output), OpenAI's
`POST /v1/embeddings` (each item batched like a request of its own, answered in order), and the
rerank routes, Cohere's `POST /v1/rerank` and TEI's `POST /rerank` (each (query, document) pair
batched like a request of its own, answered best first).

A handler reads the body once, identifies the caller, and runs the call the one way batch calls run
(`batch_calls`): admission, then each input's own future, which the model resolves. A client that goes
away cancels the handler: its inputs still waiting are withdrawn and never computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from functools import partial
from typing import Any

from aiohttp import web

from ..admission.rate_limits import Identity
from ..calls.batch_calls import BatchCalls, cache_allowed, call_start, call_timing
from ..calls.context import CallContext, CallHandlers
from ..errors import InferdError, InvalidInput, ModelNotFound
from ..messages import RequestState
from ..models.batch_model import BatchModel
from ..observability.outcomes import Call
from ..wire.classify_body import ClassifyBody
from ..wire.dialects import (
    CLASSIFY,
    COHERE_EMBED,
    EMBEDDINGS,
    INFINITY_CLASSIFY,
    INFINITY_EMBEDDINGS,
    RERANK,
    TEI_EMBED,
    TEI_EMBED_ALL,
    TEI_PREDICT,
    TEI_RERANK,
    TEI_ROOT_BY_KIND,
    TEI_ROOT_EMBED,
    TEI_SIMILARITY,
    Dialect,
)
from ..wire.embeddings import EmbeddingsBody, shaped
from ..wire.inference_body import InferenceBody, encode_vector, input_kind, parse_image_body, parse_inference_body
from ..wire.json_values import dumps
from ..wire.rerank_body import RerankBody
from .body_reader import BodyReader
from .call_tracing import client_of
from .generation import GenerationApi
from .responses import WholeResponse, error_response
from .routes import Route, call_route

_ATTACHED, _CACHED = RequestState.ATTACHED, RequestState.CACHED
TEI_ROOT = "/"  # (its dialect is the default model's: `InferenceApi.tei_root_dialect`)
# Every batch call's path, and the dialect of its body and answer (None: one input, inferd's own). The
# fast path takes the same paths (`fast_path`). Infinity's paths are OpenAI's without `/v1`; its rerank
# body posts to `/rerank`, beside TEI's (the body says which).
CALL_PATHS: dict[str, Dialect | None] = {
    "/v1/inference": None, "/api/inference": None, "/v1/embeddings": EMBEDDINGS, "/v1/rerank": RERANK,
    "/rerank": TEI_RERANK, "/embed": TEI_EMBED, "/v2/embed": COHERE_EMBED, "/v1/classify": CLASSIFY,
    "/predict": TEI_PREDICT, "/embeddings": INFINITY_EMBEDDINGS, "/classify": INFINITY_CLASSIFY,
    "/similarity": TEI_SIMILARITY, "/embed_all": TEI_EMBED_ALL, TEI_ROOT: TEI_ROOT_EMBED,
}


@dataclass(slots=True)
class OneInput:
    """A `/v1/inference` call as far as it got: its record (`call`), and what routing it found."""

    call: Call
    who: Identity | None = None
    parsed: InferenceBody | None = None  # the body
    model: BatchModel | None = None


class InferenceApi(CallHandlers):
    """Handlers for the batch models (and `/v1/inference` for a generation model, handed on)."""

    def __init__(self, context: CallContext, body: BodyReader, generation: GenerationApi | None) -> None:
        super().__init__(context)
        self.body = body
        self.generation = generation
        self.calls = BatchCalls(context.admission, context.outcomes)

    def routes(self) -> dict[str, Route]:
        """Every batch call's route (`CALL_PATHS`), in the dialect of its path."""
        context, declared = self.context, {}
        for path, dialect in CALL_PATHS.items():
            if dialect is None:
                declared[path] = call_route(context, self.inference)
            elif path == TEI_ROOT:
                declared[path] = call_route(context, self.tei_root)
            else:
                declared[path] = call_route(context, partial(self.call_of_many, dialect), openai_errors=dialect.openai)
        return declared

    async def inference(self, request: web.BaseRequest, call: Call | None = None) -> web.StreamResponse:
        headers = request.headers
        one = OneInput(call_start(self.ids, headers) if call is None else call)
        one.call.client = client_of(request)
        try:
            self.identify(one, headers)
            generation = self.route(one, await self.body.read(request), headers, request.query)
            if generation is not None:
                parsed, who = one.parsed, one.who
                assert parsed is not None and who is not None and self.generation is not None  # (set on the way here)
                return await self.generation.inference(request, generation[0], parsed, who, one.call, generation[1])
            output = (await self.calls.answers(self.admit(one, headers), one.call))[0]
        except InferdError as error:
            return self.refused(one, error)
        return WholeResponse(200, *self.answered(one, output))

    # The steps of `inference`, which the connection's fast path (`fast_path`) takes too, without a task.

    def identify(self, one: OneInput | ManyInputs, headers: Mapping[str, str]) -> None:
        one.who = who = self.admission.identify(headers)
        one.call.tier, one.call.tenant = who.tier, who.tenant

    def route(self, one: OneInput, body: bytes, headers: Mapping[str, str], query: Mapping[str, str]) -> Any:
        """Read the call from the body and find its batch model (`one.model`); a generation model's
        (model, version) is returned instead, for the generation API to answer."""
        if headers.get("Content-Type", "")[:6] == "image/":  # (an image as the whole body)
            one.parsed = parsed = parse_image_body(body, query)
        else:
            one.parsed = parsed = parse_inference_body(body)
        name = parsed.model or self.models.default
        model = self.models.route(name, parsed.version)
        if model is None:
            routed = self.models.route_generation(name, parsed.version) if self.generation is not None else None
            if routed is not None:
                if type(parsed.input) is not str:
                    raise InvalidInput(f"model {name} generates from a text prompt, not an image")
                return routed
            raise ModelNotFound(f"no model named {name!r}; see GET /v1/models")
        one.model = model
        one.call.model, one.call.version = model.name, model.version
        if (type(parsed.input) is not str or model.input_kind != "text") and model.ready and \
                input_kind(parsed.input) != model.input_kind:  # (a text to a text model: two tests, no call)
            raise InvalidInput(f"model {name} takes {model.input_kind} inputs, not {input_kind(parsed.input)}")
        return None

    def admit(self, one: OneInput, headers: Mapping[str, str]) -> BatchModel:
        """Admit the call's input to its model (`identify` and `route` found them); returns the model."""
        model, parsed, who = one.model, one.parsed, one.who
        assert model is not None and parsed is not None and who is not None
        self.calls.admit(model, one.call, (parsed.input,), who, parsed.timeout_ms, cache_allowed(headers))
        return model

    def refused(self, one: OneInput | ManyInputs, error: InferdError) -> WholeResponse:
        """The call's error answer (in OpenAI's shape on its routes), recorded."""
        call = one.call
        now = self.outcomes.record_error(call, error)
        return error_response(error, call.request_id, close=self.lifecycle.draining, held_s=now - call.started,
                              openai=type(one) is ManyInputs and one.dialect.openai)

    def answered(self, one: OneInput, output: Any) -> tuple[bytes, tuple[tuple[str, str], ...]]:
        """The call's answer (its body and headers), recorded."""
        call = one.call
        pending, request_id, version = call.requests[0], call.request_id, call.version
        now = self.outcomes.record(call)
        batch = pending.batch
        extra: tuple[tuple[str, str], ...] = (("X-Request-ID", request_id), ("X-Model-Version", version))
        if batch is not None:
            timing = batch.timing(pending)
            if pending.predicted_wait is not None:  # (what admission expected the queue to take)
                timing += f", predicted_queue;dur={pending.predicted_wait * 1000:.3f}"
            extra += (("Server-Timing", timing + ', shared;desc="collapsed"' if pending.state is _ATTACHED else timing),)
        elif pending.state is _CACHED:
            extra += (("Server-Timing", 'cache;desc="hit"'),)
        if one.parsed is not None and one.parsed.base64:
            output = encode_vector(output, base64=True)
        payload = {"output": output, "request_id": request_id, "model": call.model, "model_version": version,
                   "latency_ms": round((now - call.started) * 1e6) / 1000}  # (to the µs: no decimal rounding, half the cost)
        return dumps(payload), extra

    async def tei_root(self, request: web.BaseRequest, call: Call | None = None) -> web.StreamResponse:
        """Text Embeddings Inference's `POST /`, where Hugging Face's `InferenceClient` (and LangChain's and
        LlamaIndex's TEI embeddings through it) post: in the dialect of what the default model does."""
        return await self.call_of_many(self.tei_root_dialect(), request, call)

    def tei_root_dialect(self) -> Dialect:
        """`/embed`'s body and answer (or `/similarity`'s), unless the default model classifies
        (`/predict`'s) or reranks (`/rerank`'s)."""
        model = self.models.route(self.models.default)
        kind = model.output_kind if model is not None else None
        return TEI_ROOT_BY_KIND.get(kind, TEI_ROOT_EMBED) if kind else TEI_ROOT_EMBED

    async def call_of_many(self, dialect: Dialect, request: web.BaseRequest, call: Call | None = None) -> web.StreamResponse:
        """A call holding several inputs, each batched like a request of its own, in `dialect`."""
        headers = request.headers
        many = ManyInputs(call_start(self.ids, headers) if call is None else call, dialect)
        many.call.client = client_of(request)
        try:
            self.identify(many, headers)
            model = self.take(many, await self.body.read(request), headers)
            outputs = await self.calls.answers(model, many.call)
        except InferdError as error:
            return self.refused(many, error)
        return WholeResponse(200, *self.answered_many(many, outputs))

    # The steps of `call_of_many`, which the fast path takes too.

    def take(self, many: ManyInputs, body: bytes, headers: Mapping[str, str]) -> BatchModel:
        """Read the call from the body, find its model (`many.model`, returned), refuse what it cannot
        honour, and admit its inputs (`many.call.requests`) for the caller `identify` found."""
        call, kind, who = many.call, many.dialect.kind, many.who
        assert who is not None
        many.parsed = parsed = many.dialect.parse(body)
        name = parsed.model or self.models.default_for(kind)
        many.model = model = self.models.route(name)
        if model is None:
            raise self.models.not_found(name, f"{kind} model")
        call.model, call.version = model.name, model.version
        if model.ready and model.output_kind != kind:
            raise InvalidInput(f"model {name} {_NOT_OF_KIND[kind]}")
        cap = model.config.max_inputs_per_call
        if parsed.count > cap:  # (before each input is read: their number alone can be a 400)
            raise InvalidInput(f"the call holds {parsed.count} inputs; model {name} takes at most {cap} per call")
        inputs = parsed.inputs
        _refuse_what_the_model_cannot_honour(parsed, model, inputs)
        self.calls.admit(model, call, inputs, who, parsed.timeout_ms, cache_allowed(headers))
        return model

    def answered_many(self, many: ManyInputs, outputs: list[Any]) -> tuple[bytes, tuple[tuple[str, str], ...]]:
        """The call's answer (its body and headers) from its outputs in order, recorded."""
        call, parsed = many.call, many.parsed
        now = self.outcomes.record(call)
        if isinstance(parsed, EmbeddingsBody) and many.model is not None:  # (cut to `dimensions`, normalised as asked)
            outputs = shaped(outputs, parsed, many.model.offers.normalized)
        requests = call.requests
        payload = many.dialect.answer(parsed, outputs, call.model, call.request_id, sum(r.tokens for r in requests))
        return dumps(payload), (("X-Request-ID", call.request_id), ("X-Model-Version", call.version),
                                ("Server-Timing", call_timing(requests, now - call.started)))


_NOT_OF_KIND = {"embedding": "does not produce embeddings",
                "rerank": 'is not a reranker (task = "rerank" of the text backend)',
                "classification": 'is not a text classifier (task = "classification" of the text backend)'}


def _refuse_what_the_model_cannot_honour(call: Any, model: BatchModel, inputs: list[Any]) -> None:
    if isinstance(call, EmbeddingsBody) and model.ready:
        wrong = next((input_kind(item) for item in inputs if input_kind(item) != model.input_kind), None)
        if wrong is not None:
            raise InvalidInput(f"model {model.name} takes {model.input_kind} inputs, not {wrong}")
        _refuse_vectors_it_cannot_give(call, model)
    if isinstance(call, RerankBody):
        _refuse_long_pairs(call, model)
    if isinstance(call, ClassifyBody) and model.ready and model.input_kind != "text":
        raise InvalidInput(f"model {model.name} classifies {model.input_kind} inputs: send them to /v1/inference")
    if call.truncate is False and model.config.options.get("truncate", True):  # (TEI's `truncate`: /rerank, /embed)
        raise InvalidInput(f"`truncate: false` is not served by model {model.name}: it truncates every input to its "
                           "max_tokens (its option truncate = false refuses long inputs instead)")


def _refuse_vectors_it_cannot_give(call: EmbeddingsBody, model: BatchModel) -> None:
    """`dimensions` the model does not take, TEI's `normalize: false` on a model that normalises, TEI's
    `/embed_all` on a model without per-token vectors: a 400 naming the field, before anything is computed."""
    if call.every_token and not model.offers.token_embeddings:
        raise InvalidInput(f"/embed_all is not served by model {model.name}: it gives no per-token vectors "
                           "(a text embedding model of the transformer backend does)")
    sizes, size = model.offers.embedding_sizes, call.dimensions
    if size is not None:
        if sizes is None:
            raise InvalidInput(f"`dimensions` is not served by model {model.name}: its vectors come at their own size")
        if size > sizes if isinstance(sizes, int) else size not in sizes:
            allowed = f"up to {sizes}" if isinstance(sizes, int) else ", ".join(map(str, sizes))
            raise InvalidInput(f"`dimensions` {size} is not served by model {model.name}: it takes {allowed}")
    if call.normalize is False and model.offers.normalized:
        raise InvalidInput(f"`normalize: false` is not served by model {model.name}: its vectors are normalised "
                           "(a text model with the option normalize = false serves its raw vectors)")


def _refuse_long_pairs(call: RerankBody, model: BatchModel) -> None:
    """A pair's characters (query and document together) count against `max_input_chars`, as a text's do."""
    cap = model.config.max_input_chars
    longest = len(call.query) + max(len(document) for document in call.documents)
    if longest > cap:
        raise InvalidInput(f"a query and document are {longest} characters; model {model.name} accepts at most {cap}")


@dataclass(slots=True)
class ManyInputs:
    """A call of several inputs (`Dialect`) as far as it got: its record, and what routing found."""

    call: Call
    dialect: Dialect
    who: Identity | None = None
    parsed: Any = None  # the body (`EmbeddingsBody`, `RerankBody`, `ClassifyBody`)
    model: BatchModel | None = None
