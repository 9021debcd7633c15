"""Text Embeddings Inference's tokeniser routes: `POST /tokenize` (each text's tokens as the model reads
it) and `POST /decode` (token ids back to text), in TEI's shapes, answered from the model's own
tokeniser (the backend's `tokens_of` and `text_of`) on a thread, never on the event loop.

TEI's body names no model: the default model answers when it has a tokeniser, else the first model
that has one; inferd also reads a `model`. The caller is identified as on the compute routes, and its
rate limit counts each text as a compute route's input (a caller refused 429 on /v1/embeddings had
its 0.9 MB /tokenize calls served, and another tenant's embeddings went from 9-16 ms to 650 ms);
nothing is batched or queued (a tokeniser call is microseconds a text), at most `MAX_AT_ONCE` calls
run at a time (more are refused 503 at once, `retry_after_ms`, rather than each taking a thread), and a
call holds at most the model's `max_inputs_per_call` texts or id lists, each text at most
`max_input_chars`.

vLLM's `POST /tokenize` shares the path: a body with `prompt` (a text) or `messages` (a chat, through the
model's chat template, with the generation prompt as `/v1/chat/completions` applies it) is answered for a
generation model, in vLLM's shape (`count`, `max_model_len`, `tokens`), from its engine's tokeniser.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from functools import partial
from typing import Any

from aiohttp import web

from ..calls.context import CallContext, CallHandlers
from ..errors import InferdError, InvalidInput, ModelNotFound, NotReady, ServiceOverloaded
from ..models.batch_model import BatchModel
from ..models.generation import GenerationModel
from ..wire.json_values import dumps, json_object
from ..wire.openai_text import parse_text_call
from .body_reader import BodyReader
from .responses import WholeResponse, error_response

MAX_AT_ONCE = 2  # tokeniser calls running at once (each on a thread of its own, holding its texts)


class TokensApi(CallHandlers):
    """`/tokenize` and `/decode` (see the module docstring)."""

    def __init__(self, context: CallContext, body: BodyReader) -> None:
        super().__init__(context)
        self.body = body
        self.running = 0  # calls on a thread now (at most MAX_AT_ONCE)

    async def tokenize(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._answer(request, _tokenize)

    async def decode(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._answer(request, _decode)

    async def _answer(self, request: web.BaseRequest, run: Callable[[BatchModel, dict[str, Any]], Any]) -> web.StreamResponse:
        request_id = self.ids.pick(request.headers.get("X-Request-ID"))
        try:
            who = self.admission.identify(request.headers)
            if self.running >= MAX_AT_ONCE:  # (before the body: a flood is refused without reading it)
                raise ServiceOverloaded(f"the tokeniser is busy with {self.running} calls; retry shortly",
                                        retry_after_ms=100, reason="tokenizer_busy")
            data = json_object(await self.body.read(request))
            if run is _tokenize and ("prompt" in data or "messages" in data):  # (vLLM's body: a generation model's)
                generation = self._generation_model(data.get("model"))
                name, scale, work = generation.name, generation.capacity_scale(), partial(_vllm_tokenize, generation, data)
            else:
                model = self._model(data.get("model"))
                name, scale, work = model.name, model.capacity_scale(), partial(run, model, data)
            if who.rate_per_s is not None:
                self.admission.limiter.check(who, name, scale, time.monotonic(), _texts_in(data))
            self.running += 1
            try:
                answer = await asyncio.to_thread(work)
            finally:
                self.running -= 1
        except InferdError as error:
            return error_response(error, request_id)
        return WholeResponse(200, dumps(answer), (("X-Request-ID", request_id),))

    def _model(self, name: Any) -> BatchModel:
        if name is not None and not isinstance(name, str):
            raise InvalidInput("`model` must be a string")
        if name is not None:
            model = self.models.route(name)
            if model is None:
                raise self.models.not_found(name, "batch model")
        else:  # (TEI's body names none: the default model, else the first with a tokeniser, else one still loading)
            candidates = [m for m in (self.models.route(self.models.default), *self.models.batch.values()) if m is not None]
            model = next((m for m in candidates if m.offers.tokens_of is not None), None) or \
                next((m for m in candidates if not m.ready), candidates[0] if candidates else None)
            if model is None:
                raise ModelNotFound("this server serves no batch model; see GET /v1/models")
        if not model.ready:
            raise NotReady(f"model {model.name} is not ready yet", retry_after_ms=1000)
        if model.offers.tokens_of is None or model.offers.text_of is None:
            raise InvalidInput(f"model {model.name} has no tokeniser to show: /tokenize and /decode serve text models")
        return model

    def _generation_model(self, name: Any) -> GenerationModel:
        """vLLM's `/tokenize`: the generation model named, else the default (or the only) one."""
        if name is not None and not isinstance(name, str):
            raise InvalidInput("`model` must be a string")
        if name is None:
            models = self.models.generation
            model = models.get(self.models.default) or (next(iter(models.values())) if len(models) == 1 else None)
            if model is None:
                raise InvalidInput("a body with `prompt` or `messages` is vLLM's /tokenize: name its generation model "
                                   "(`model`); see GET /v1/models" if models else
                                   "a body with `prompt` or `messages` is vLLM's /tokenize, and this server serves no "
                                   "generation model; TEI's body is `inputs`")
        else:
            routed = self.models.route_generation(name)
            if routed is None:
                raise self.models.not_found(name, "generation model")
            model = routed[0]
        if not model.ready or model.engine is None:
            raise model.not_ready()  # (starting, or stopping)
        return model


def _vllm_tokenize(model: GenerationModel, data: dict[str, Any]) -> dict[str, Any]:
    """vLLM's body: `prompt` or `messages` (one of them), `add_special_tokens` and, for a chat,
    `add_generation_prompt` as vLLM's defaults have them (other values, and `return_token_strs`, are
    refused, not ignored)."""
    if ("prompt" in data) == ("messages" in data):
        raise InvalidInput("give one of `prompt` (a text) and `messages` (a chat), not both")
    chat = "messages" in data
    for key, default in (("add_special_tokens", not chat), ("add_generation_prompt", True), ("return_token_strs", False)):
        if data.get(key, default) is not default:
            raise InvalidInput(f"`{key}` other than {str(default).lower()} (vLLM's default here) is not served on /tokenize")
    text = parse_text_call({"messages": data["messages"]} if chat else {"prompt": data["prompt"]}, chat)
    model.check_length(text.chars)
    engine = model.engine
    assert engine is not None  # (checked in _generation_model)
    try:
        ids = engine.encode_chat(text.messages) if chat else engine.encode(text.prompt)
    except ValueError as exc:  # (a chat its template refuses)
        raise InvalidInput(str(exc)) from None
    return {"count": len(ids), "max_model_len": engine.max_model_len, "tokens": ids, "token_strs": None}


def _texts_in(data: dict[str, Any]) -> int:
    """How many texts a /tokenize or /decode body holds, as its rate limit counts them (one at least)."""
    inputs = data["inputs"] if "inputs" in data else data.get("ids")
    if isinstance(inputs, list) and inputs and (isinstance(inputs[0], (str, list))):
        return len(inputs)
    return 1


def _tokenize(model: BatchModel, data: dict[str, Any]) -> list[list[dict[str, Any]]]:
    """TEI's body: `inputs` (a string or strings), `add_special_tokens` (default true); `prompt_name` is
    refused (no prompts are configured). Always a list of token lists, one per text."""
    inputs = data.get("inputs")
    texts = [inputs] if isinstance(inputs, str) else inputs
    if not isinstance(texts, list) or not texts or not all(isinstance(t, str) for t in texts):
        raise InvalidInput("`inputs` must be a string or a non-empty list of strings")
    _check_count(model, len(texts), "texts")
    longest = max(len(t) for t in texts)
    if longest > model.config.max_input_chars:
        raise InvalidInput(f"input is {longest} characters; model {model.name} accepts at most {model.config.max_input_chars}")
    if data.get("prompt_name") is not None:
        raise InvalidInput("`prompt_name` is not served: no prompts are configured for this model")
    tokens_of = model.offers.tokens_of
    assert tokens_of is not None  # (checked in _model)
    return tokens_of(texts, _flag(data, "add_special_tokens"))


def _decode(model: BatchModel, data: dict[str, Any]) -> list[str]:
    """TEI's body: `ids` (a list of token ids, or a list of such lists), `skip_special_tokens` (default
    true). One string per list."""
    ids = data.get("ids")
    lists = [ids] if isinstance(ids, list) and ids and all(type(i) is int for i in ids) else ids
    if not isinstance(lists, list) or not lists or not all(
            isinstance(one, list) and all(type(i) is int for i in one) for one in lists):
        raise InvalidInput("`ids` must be a list of token ids or a non-empty list of such lists")
    _check_count(model, len(lists), "id lists")
    text_of = model.offers.text_of
    assert text_of is not None  # (checked in _model)
    try:
        return text_of(lists, _flag(data, "skip_special_tokens"))
    except ValueError as exc:
        raise InvalidInput(str(exc)) from None


def _flag(data: dict[str, Any], name: str) -> bool:
    value = data.get(name, True)
    if not isinstance(value, bool):
        raise InvalidInput(f"`{name}` must be true or false")
    return value


def _check_count(model: BatchModel, count: int, what: str) -> None:
    cap = model.config.max_inputs_per_call
    if count > cap:
        raise InvalidInput(f"the call holds {count} {what}; model {model.name} takes at most {cap} per call")
