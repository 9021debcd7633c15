"""The batch models' endpoints: `POST /v1/inference` (one input, one output), OpenAI's
`POST /v1/embeddings` (each item batched like a request of its own, answered in order), and the
rerank routes, Cohere's `POST /v1/rerank` and TEI's `POST /rerank` (each (query, document) pair
batched like a request of its own, answered best first).

A handler reads the body once, identifies the caller, and runs the call the one way batch calls run
(`batch_calls`): admission, then each input's own future, which the model resolves. A client that goes
away cancels the handler: its inputs still waiting are withdrawn and never computed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

from ..admission.admission import Admission
from ..admission.rate_limits import Identity
from ..errors import InferdError, InvalidInput, ModelNotFound
from ..lifecycle import Lifecycle
from ..messages import PendingRequest, RequestState
from ..models.batch_model import BatchModel
from ..models.registry import Models
from ..observability.outcomes import Outcomes
from .batch_calls import BatchCalls, CallStart, cache_allowed, call_start, call_timing
from .body_reader import BodyReader
from .classify_body import (
    ClassifyCall,
    classify_payload,
    parse_classify_body,
    parse_tei_predict_body,
    tei_predict_payload,
)
from .embeddings import (
    EmbeddingsCall,
    cohere_embed_payload,
    embeddings_payload,
    parse_cohere_embed_body,
    parse_embeddings_body,
    parse_tei_embed_body,
    shaped,
)
from .generation import GenerationApi
from .inference_body import InferenceCall, encode_vector, input_kind, parse_image_body, parse_inference_body
from .request_ids import RequestIds
from .rerank_body import (
    RerankCall,
    parse_rerank_body,
    parse_tei_rerank_body,
    ranked,
    rerank_payload,
    tei_rerank_payload,
)
from .responses import WholeResponse, dumps, error_response

_ATTACHED, _CACHED = RequestState.ATTACHED, RequestState.CACHED


@dataclass(slots=True)
class OneInput:
    """A `/v1/inference` call as far as it got: what its answer or its refusal is recorded with."""

    start: CallStart
    who: Identity | None = None
    tier: str = "-"
    tenant: str = "-"
    call: InferenceCall | None = None
    model: BatchModel | None = None
    items: list[PendingRequest] = field(default_factory=list)


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
        one = OneInput(call_start(self.ids, headers) if start is None else start)
        try:
            self.identify(one, headers)
            generation = self.route(one, await self.body.read(request), headers, request.query)
            if generation is not None:
                call, who = one.call, one.who
                assert call is not None and who is not None and self.generation is not None  # (set on the way here)
                return await self.generation.inference(request, generation[0], call, who, one.start, generation[1])
            self.admit(one, headers)
            output = (await self.calls.answers(one.model, one.start, one.items, one.who))[0]  # type: ignore[arg-type]
        except InferdError as error:
            return self.refused(one, error)
        return WholeResponse(200, *self.answered(one, output))

    # The steps of `inference`, which the connection's fast path (`fast_path`) takes too, without a task.

    def identify(self, one: OneInput, headers: Mapping[str, str]) -> None:
        one.who = who = self.admission.identify(headers)
        one.tier, one.tenant = who.tier, who.tenant

    def route(self, one: OneInput, body: bytes, headers: Mapping[str, str], query: Mapping[str, str]) -> Any:
        """Read the call from the body and find its batch model (`one.model`); a generation model's
        (model, version) is returned instead, for the generation API to answer."""
        if headers.get("Content-Type", "")[:6] == "image/":  # (an image as the whole body)
            one.call = call = parse_image_body(body, query)
        else:
            one.call = call = parse_inference_body(body)
        name = call.model or self.models.default
        model = self.models.route(name, call.version)
        if model is None:
            routed = self.models.route_generation(name, call.version) if self.generation is not None else None
            if routed is not None:
                if type(call.input) is not str:
                    raise InvalidInput(f"model {name} generates from a text prompt, not an image")
                return routed
            raise ModelNotFound(f"no model named {name!r}; see GET /v1/models")
        one.model = model
        if (type(call.input) is not str or model.input_kind != "text") and model.ready and \
                input_kind(call.input) != model.input_kind:  # (a text to a text model: two tests, no call)
            raise InvalidInput(f"model {name} takes {model.input_kind} inputs, not {input_kind(call.input)}")
        return None

    def admit(self, one: OneInput, headers: Mapping[str, str]) -> None:
        one.items = self.calls.admit(one.model, one.start, (one.call.input,), one.who, one.call.timeout_ms,  # type: ignore[arg-type, union-attr]
                                     cache_allowed(headers))

    def refused(self, one: OneInput, error: InferdError) -> WholeResponse:
        """The call's error answer, recorded."""
        start, model = one.start, one.model
        now = self.outcomes.record_error(start.request_id, model.name if model else "-", one.tier, error, start.started,
                                         one.items[0] if one.items else None, one.tenant, start.trace,
                                         model.version if model else "")
        return error_response(error, start.request_id, close=self.lifecycle.draining, held_s=now - start.started)

    def answered(self, one: OneInput, output: Any) -> tuple[bytes, tuple[tuple[str, str], ...]]:
        """The call's answer (its body and headers), recorded."""
        start, model, pending = one.start, one.model, one.items[0]
        request_id, model_name = start.request_id, model.name  # type: ignore[union-attr]
        now = self.outcomes.record(request_id, model_name, one.tier, 200, "", start.started, pending, one.tenant,
                                   start.trace, model.version)  # type: ignore[union-attr]
        batch = pending.batch
        extra: tuple[tuple[str, str], ...] = (("X-Request-ID", request_id), ("X-Model-Version", model.version))  # type: ignore[union-attr]
        if batch is not None:
            timing = batch.timing(pending)
            if pending.predicted_wait is not None:  # (what admission expected the queue to take)
                timing += f", predicted_queue;dur={pending.predicted_wait * 1000:.3f}"
            extra += (("Server-Timing", timing + ', shared;desc="collapsed"' if pending.state is _ATTACHED else timing),)
        elif pending.state is _CACHED:
            extra += (("Server-Timing", 'cache;desc="hit"'),)
        if one.call.base64:  # type: ignore[union-attr]
            output = encode_vector(output, base64=True)
        payload = {"output": output, "request_id": request_id, "model": model_name, "model_version": model.version,  # type: ignore[union-attr]
                   "latency_ms": round((now - start.started) * 1e6) / 1000}  # (to the µs: no decimal rounding, half the cost)
        return dumps(payload), extra

    async def embeddings(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        """OpenAI's `POST /v1/embeddings`: each item batched like a request of its own, answered in order."""
        return await self._call_of_many(request, start, parse_embeddings_body, "embedding", _embeddings_answer,
                                        openai=True)

    async def tei_embed(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        """Text Embeddings Inference's `POST /embed`: the same computation, TEI's body and an array of vectors."""
        return await self._call_of_many(request, start, parse_tei_embed_body, "embedding", _tei_embed_answer)

    async def cohere_embed(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        """Cohere's `POST /v2/embed`: the same computation, each vector in the types asked."""
        return await self._call_of_many(request, start, parse_cohere_embed_body, "embedding", _cohere_embed_answer)

    async def classify(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        """vLLM's `POST /v1/classify`: each text classified like a request of its own, every label's probability."""
        return await self._call_of_many(request, start, parse_classify_body, "classification", classify_payload,
                                        openai=True)

    async def tei_predict(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        """Text Embeddings Inference's `POST /predict`: the same computation, TEI's body and answer."""
        return await self._call_of_many(request, start, parse_tei_predict_body, "classification", tei_predict_payload)

    async def rerank(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        """Cohere's `POST /v1/rerank` (Jina's clients send the same): relevance scores, best first."""
        return await self._call_of_many(request, start, parse_rerank_body, "rerank", _rerank_answer)

    async def tei_rerank(self, request: web.BaseRequest, start: CallStart | None = None) -> web.StreamResponse:
        """Text Embeddings Inference's `POST /rerank`: the same computation, TEI's body and answer."""
        return await self._call_of_many(request, start, parse_tei_rerank_body, "rerank", _tei_rerank_answer)

    async def _call_of_many(self, request: web.BaseRequest, start: CallStart | None, parse: Callable[[bytes], Any],
                            kind: str, answer: Answer, *, openai: bool = False) -> web.StreamResponse:
        """A call holding several inputs, each batched like a request of its own: `parse` reads the body
        (its `inputs`, `model`, `timeout_ms`), the model must give outputs of `kind`, and `answer` writes
        the payload from the outputs in the call's order."""
        headers = request.headers
        if start is None:
            start = call_start(self.ids, headers)
        started, request_id = start.started, start.request_id
        model_name, version, tier, tenant, items = "-", "", "-", "-", []
        try:
            who = self.admission.identify(headers)
            tier, tenant = who.tier, who.tenant
            call = parse(await self.body.read(request))
            name = call.model or self.models.default_for(kind)
            model = self.models.route(name)
            if model is None:
                raise ModelNotFound(f"no {kind} model named {name!r}; see GET /v1/models")
            model_name, version = model.name, model.version
            if model.ready and model.output_kind != kind:
                raise InvalidInput(f"model {name} {_NOT_OF_KIND[kind]}")
            cap = model.config.max_inputs_per_call
            if call.count > cap:  # (before each input is read: their number alone can be a 400)
                raise InvalidInput(f"the call holds {call.count} inputs; model {name} takes at most {cap} per call")
            inputs = call.inputs
            _refuse_what_the_model_cannot_honour(call, model, inputs)
            items = self.calls.admit(model, start, inputs, who, call.timeout_ms, cache_allowed(headers))
            outputs = await self.calls.answers(model, start, items, who)
        except InferdError as error:
            now = self.outcomes.record_error(request_id, model_name, tier, error, started, None, tenant, start.trace, version,
                                             items[0].slo_at if items else None)
            return error_response(error, request_id, close=self.lifecycle.draining, openai=openai, held_s=now - started)
        now = self.outcomes.record(request_id, model_name, tier, 200, "", started, None, tenant, start.trace, version,
                                   items[0].slo_at)
        if isinstance(call, EmbeddingsCall):  # (cut to `dimensions`, normalised as asked)
            outputs = shaped(outputs, call, model.offers.normalized)
        payload = answer(call, outputs, model_name, request_id, sum(item.tokens for item in items))
        return WholeResponse(200, dumps(payload), (("X-Request-ID", request_id), ("X-Model-Version", model.version),
                                                   ("Server-Timing", call_timing(items, now - started))))


# A call of several inputs answered: (the parsed call, its outputs in order, the model, the request id, tokens).
Answer = Callable[[Any, list[Any], str, str, int], Any]
_NOT_OF_KIND = {"embedding": "does not produce embeddings",
                "rerank": 'is not a reranker (task = "rerank" of the text backend)',
                "classification": 'is not a text classifier (task = "classification" of the text backend)'}


def _refuse_what_the_model_cannot_honour(call: Any, model: BatchModel, inputs: list[Any]) -> None:
    if isinstance(call, EmbeddingsCall) and model.ready:
        wrong = next((input_kind(item) for item in inputs if input_kind(item) != model.input_kind), None)
        if wrong is not None:
            raise InvalidInput(f"model {model.name} takes {model.input_kind} inputs, not {wrong}")
        _refuse_vectors_it_cannot_give(call, model)
    if isinstance(call, RerankCall):
        _refuse_long_pairs(call, model)
    if isinstance(call, ClassifyCall) and model.ready and model.input_kind != "text":
        raise InvalidInput(f"model {model.name} classifies {model.input_kind} inputs: send them to /v1/inference")
    if call.truncate is False and model.config.options.get("truncate", True):  # (TEI's `truncate`: /rerank, /embed)
        raise InvalidInput(f"`truncate: false` is not served by model {model.name}: it truncates every input to its "
                           "max_tokens (its option truncate = false refuses long inputs instead)")


def _refuse_vectors_it_cannot_give(call: EmbeddingsCall, model: BatchModel) -> None:
    """`dimensions` the model does not take, TEI's `normalize: false` on a model that normalises: a 400
    naming the field, before anything is computed."""
    sizes, size = model.offers.embedding_sizes, call.dimensions
    if size is not None and sizes is None:
        raise InvalidInput(f"`dimensions` is not served by model {model.name}: its vectors come at their own size")
    if size is not None and (size > sizes if isinstance(sizes, int) else size not in sizes):  # type: ignore[operator]
        allowed = f"up to {sizes}" if isinstance(sizes, int) else ", ".join(map(str, sizes))  # type: ignore[arg-type]
        raise InvalidInput(f"`dimensions` {size} is not served by model {model.name}: it takes {allowed}")
    if call.normalize is False and model.offers.normalized:
        raise InvalidInput(f"`normalize: false` is not served by model {model.name}: its vectors are normalised")


def _refuse_long_pairs(call: RerankCall, model: BatchModel) -> None:
    """A pair's characters (query and document together) count against `max_input_chars`, as a text's do."""
    cap = model.config.max_input_chars
    longest = len(call.query) + max(len(document) for document in call.documents)
    if longest > cap:
        raise InvalidInput(f"a query and document are {longest} characters; model {model.name} accepts at most {cap}")


def _embeddings_answer(call: EmbeddingsCall, vectors: list[Any], model: str, request_id: str, tokens: int) -> Any:
    return embeddings_payload(model, vectors, tokens, call.encodings[0])


def _cohere_embed_answer(call: EmbeddingsCall, vectors: list[Any], model: str, request_id: str, tokens: int) -> Any:
    return cohere_embed_payload(call, vectors, request_id, tokens)


def _tei_embed_answer(call: EmbeddingsCall, vectors: list[Any], model: str, request_id: str, tokens: int) -> Any:
    return vectors


def _rerank_answer(call: RerankCall, logits: list[float], model: str, request_id: str, tokens: int) -> Any:
    return rerank_payload(call, ranked(call, logits), model, request_id, tokens)


def _tei_rerank_answer(call: RerankCall, logits: list[float], model: str, request_id: str, tokens: int) -> Any:
    return tei_rerank_payload(call, ranked(call, logits))

