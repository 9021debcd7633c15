"""HTTP for generation models: `/v1/inference` (whole text or Server-Sent Events) and the
OpenAI-compatible `/v1/completions` and `/v1/chat/completions`, so the official `openai` client works
against inferd unchanged.

Each request: identify the caller, admit it (the prompt's length first, the same rules as batch models,
then the engine's waiting bounds, all before tokenising), tokenise off the loop (applying the chat
template for chat), then consume the engine's deltas under the request's deadline.
A passed deadline aborts the request in the engine and answers 504 (or, mid-stream, a final error
event); a client that goes away aborts it too.

Why one module: the three request shapes differ only in how they are read and answered (`Generation`);
one run (`_generate`) serves them all.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from aiohttp import web

from ..admission.rate_limits import Identity
from ..calls.batch_calls import call_start
from ..calls.context import CallContext, CallHandlers
from ..errors import DeadlineExceeded, InferdError, InferenceFailed, InvalidInput, ModelNotFound, describe
from ..observability.outcomes import Call
from ..observability.tracing import Generated
from ..wire.inference_body import InferenceBody, timeout_ms
from ..wire.json_values import dumps, json_object
from ..wire.openai_text import Choice, TextAnswer, parse_text_call
from ..wire.sampling_fields import sampling_fields
from .body_reader import BodyReader
from .responses import WholeResponse, error_response
from .routes import Route, call_route

if TYPE_CHECKING:
    from ..models.adapters import Adapter
    from ..models.generation import GenerationModel
    from ..models.generation_promises import Promise

log = logging.getLogger("inferd.generation")
GENERATION_PATHS = ("/v1/completions", "/v1/chat/completions")  # OpenAI's (`GenerationApi.routes`)
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "Server": "inferd"}


@dataclass(frozen=True, slots=True)
class Generation:
    """One generation call, routed and read: what `_generate` runs, whatever the request's shape."""

    model: GenerationModel
    body: dict[str, Any]  # the request's fields (sampling, `stream`, `timeout_ms`)
    who: Identity
    call: Call
    chars: int  # the prompt's characters (admission's first estimate of its tokens)
    prompt_ids: Callable[[Promise], Awaitable[list[int]]]  # its prompt tokenised (moves the place admission reserved)
    whole: Callable[[list[Choice], Any], dict]  # the answer whole, from its choices and last delta
    chunk: Callable[[str, Any], list[dict]]  # a stream's events for one delta
    openai: bool  # errors in OpenAI's shape, a stream ends with `data: [DONE]`, `n` choices may be asked
    adapter: Adapter | None = None  # the LoRA adapter it goes through


class GenerationApi(CallHandlers):
    """Handlers for the generation models."""

    def __init__(self, context: CallContext, body: BodyReader) -> None:
        super().__init__(context)
        self.body = body

    def routes(self) -> dict[str, Route]:
        """OpenAI's two generation routes; a keyed repeat of a running one is refused (a stream is not shared)."""
        completions, chat = GENERATION_PATHS
        return {completions: call_route(self.context, self.completions, keyed="once", openai_errors=True),
                chat: call_route(self.context, self.chat_completions, keyed="once", openai_errors=True)}

    # ---- the three request shapes ----------------------------------------------------------------

    async def inference(self, request: web.BaseRequest, model: GenerationModel, parsed: InferenceBody, who: Identity,
                        call: Call, adapter: Adapter | None = None) -> web.StreamResponse:
        """inferd's own shape: {"input": text} -> {"output": text}, or SSE with {"stream": true}. The
        body was read and the caller identified by the `/v1/inference` handler."""
        request_id, started = call.request_id, call.started
        body, prompt = parsed.body, parsed.input
        assert isinstance(prompt, str)  # (an image was refused when the request was routed here)
        def whole(choices: list[Choice], last: Any) -> dict[str, Any]:
            return {"output": choices[0].text, "request_id": request_id, "model": model.name,
                    "latency_ms": round((time.monotonic() - started) * 1000, 3),
                    "finish_reason": choices[0].finish_reason, "usage": _usage(last)}

        def chunk(text: str, last: Any) -> list[dict[str, Any]]:
            if not text and not last.done:
                return []  # (a step that decoded to nothing yet: no event for it)
            event: dict[str, Any] = {"delta": text, "request_id": request_id}
            if last.done:
                event.update(done=True, finish_reason=last.finish_reason, usage=_usage(last))
            return [event]

        return await self._serve(request, Generation(model, body, who, call, len(prompt),
                                                     partial(_prompt, model, text=prompt, chars=len(prompt)), whole, chunk,
                                                     openai=False, adapter=adapter))

    async def completions(self, request: web.BaseRequest, call: Call | None = None) -> web.StreamResponse:
        return await self._openai(request, chat=False, call=call)

    async def chat_completions(self, request: web.BaseRequest, call: Call | None = None) -> web.StreamResponse:
        return await self._openai(request, chat=True, call=call)

    async def _openai(self, request: web.BaseRequest, chat: bool, call: Call | None) -> web.StreamResponse:
        if call is None:
            call = call_start(self.ids, request.headers)
        try:
            who = self.admission.identify(request.headers)
            call.tier, call.tenant = who.tier, who.tenant
            body = json_object(await self.body.read(request))
            name = body.get("model")
            if not isinstance(name, str):
                raise InvalidInput("`model` is required and must be a string; see GET /v1/models")
            routed = self.models.route_generation(name)
            if routed is None:
                raise ModelNotFound(f"no generation model named {name!r}; see GET /v1/models")
            model, adapter = routed
            parsed = parse_text_call(body, chat)
            tools = model.tool_plan(body) if chat else None
            if tools is not None and tools.forced and parsed.structured is not None:
                raise InvalidInput("`response_format` (or `structured_outputs`) and a forced `tool_choice` cannot both hold the output")
        except InferdError as error:
            self.outcomes.record_error(call, error)
            return error_response(error, call.request_id, close=self.lifecycle.draining, openai=True)
        answer = TextAnswer(parsed, name, int(time.time()), tools)  # (the model as named: an adapter's name too)
        # (the engine's: alternatives per token, and the structured output asked, a forced tool choice's
        # among them; None: none)
        structured = {"json": tools.schema} if tools is not None and tools.forced else parsed.structured
        body = {**body, "logprobs": parsed.logprobs, "structured_outputs": structured}
        if tools is not None and tools.keep_special_tokens:  # (the tool parser reads tags the tokenizer calls special)
            body["skip_special_tokens"] = False
        prompt_ids = (partial(_prompt, model, messages=parsed.messages, tools=tools.tools if tools is not None else None,
                              chars=parsed.chars)
                      if parsed.chat else partial(_prompt, model, text=parsed.prompt, chars=parsed.chars))
        return await self._serve(request, Generation(model, body, who, call, parsed.chars, prompt_ids,
                                                     lambda choices, last: answer.whole(choices, _usage(last)),
                                                     lambda text, last: answer.chunks(text, last, _usage(last)),
                                                     openai=True, adapter=adapter))

    # ---- one generation, whole or streamed -------------------------------------------------------

    async def _serve(self, request: web.BaseRequest, generation: Generation) -> web.StreamResponse:
        """One generation (`Generation`); its adapter, if any, counted as in use from here (no await since
        it was routed) to the end, so an unload waits for it."""
        adapter = generation.adapter
        if adapter is not None:
            adapter.enter()
        try:
            return await self._generate(request, generation)
        finally:
            if adapter is not None:
                adapter.leave()

    async def _generate(self, request: web.BaseRequest, generation: Generation) -> web.StreamResponse:
        """One generation, whole or streamed (see `_serve`). A traced request's stages are noted on its
        trace as they end (`Generated`), for its span."""
        model, body, who, call, adapter = generation.model, generation.body, generation.who, generation.call, generation.adapter
        openai, chunk = generation.openai, generation.chunk
        tier, tenant, request_id, trace = who.tier, who.tenant, call.request_id, call.trace
        served = adapter.name if adapter is not None else model.config.version  # (which answers: an adapter, a split's pick)
        call.tier, call.tenant, call.model, call.version = tier, tenant, model.name, served
        stages: Generated | None = None
        promise = None
        try:
            try:
                overrides = sampling_fields(body)
                if not openai and overrides.get("n", 1) != 1:
                    raise InvalidInput("`n` above 1 (several choices) is for /v1/completions and /v1/chat/completions")
                ticket = self.admission.admit_generation(model, who, timeout_ms(body), generation.chars,  # before any tokenising
                                                         overrides.get("max_tokens"), call.started)
                promise = ticket.promise
                sampling = model.sampling(overrides)
                if trace is not None:
                    trace.model, trace.tier, trace.tenant = model.name, tier, tenant
                    stages = trace.generation = Generated(promise.request_id, time.monotonic())
                ids = await generation.prompt_ids(promise)  # moves the place admission reserved; no await from here to the engine
                asked, context = overrides.get("max_tokens"), model.engine.max_model_len if model.engine else None
                if asked and context and len(ids) + asked > context:  # (as vLLM's server refuses it, not cut short)
                    raise InvalidInput(f"this model's maximum context length is {context} tokens; this request asks for "
                                       f"{len(ids) + asked} ({len(ids)} in the prompt, {asked} to generate): "
                                       f"`max_tokens` at most {context - len(ids)}")
            except BaseException:
                if promise is not None:
                    model.withdraw(promise)
                raise
        except InferdError as error:
            self.outcomes.record_error(call, error)
            return error_response(error, request_id, close=self.lifecycle.draining, openai=openai)
        timeout_s = ticket.timeout_s
        if stages is not None:
            stages.tokenized_at, stages.prompt_tokens = time.monotonic(), len(ids)
        deltas = model.stream(ids, sampling, promise, adapter)
        # The deadline, and before the first token the time to first token promised (a request whose
        # objective passes while it waits is withdrawn from the engine: it can no longer be on time).
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout_s
        ttft_s = promise.objectives.ttft_s
        first_deadline = deadline if ttft_s is None else min(deadline, loop.time() + ttft_s - (time.monotonic() - call.started))
        streaming = bool(body.get("stream"))
        response: web.StreamResponse | None = None
        pieces: dict[int, list[str]] = {}  # by choice
        made: dict[int, Choice] = {}  # by choice: how it ended, its tokens' logprobs when asked
        last = None
        try:
            async with asyncio.timeout_at(first_deadline) as limit:
                async for delta in deltas:
                    if last is None and first_deadline < deadline:
                        limit.reschedule(deadline)
                    if stages is not None:
                        _note(stages, delta)
                    last = delta
                    if not streaming:
                        choice = made.get(delta.index)
                        if choice is None:
                            choice, pieces[delta.index] = made.setdefault(delta.index, Choice(tokens=[])), []
                        pieces[delta.index].append(delta.text)
                        if delta.logprobs and choice.tokens is not None:
                            choice.tokens.extend(delta.logprobs)
                        if delta.finished:
                            choice.finish_reason = delta.finish_reason
                        continue
                    events = chunk(delta.text, delta)
                    if not events:
                        continue
                    if response is None:
                        response = web.StreamResponse(headers={**_SSE_HEADERS, "X-Request-ID": request_id, "X-Model-Version": served})
                        await response.prepare(request)
                    await response.write(b"".join(b"data: " + dumps(event) + b"\n\n" for event in events))
        except TimeoutError:
            if last is None and ttft_s is not None and first_deadline < deadline:
                model.record_abort("ttft_objective")
                failure: InferdError | None = DeadlineExceeded(
                    f"no first token within the {ttft_s * 1000:.0f} ms objective; withdrawn from the engine",
                    reason="ttft_objective")
            else:
                model.record_abort("deadline")
                failure = DeadlineExceeded(f"deadline of {timeout_s * 1000:.0f} ms passed during generation; aborted")
        except InferdError as error:  # (the model's own answer before the engine ran it: e.g. it is stopping)
            failure = error
        except (asyncio.CancelledError, ConnectionResetError):
            model.record_abort("client_disconnect")
            self.outcomes.record(call, 499, "CLIENT_DISCONNECTED")
            raise
        except Exception as exc:  # noqa: BLE001 - the engine refused or failed this request: answered, counted
            model.record_abort("engine_error")
            log.warning("model %s request %s: the engine failed it: %s", model.name, request_id, describe(exc))
            failure = (InvalidInput(f"the engine refused this request: {describe(exc)}")
                       if last is None and model.refused_by_client(exc) else
                       InferenceFailed(f"generation failed: {describe(exc)}"))
        else:
            failure = None
        finally:
            await deltas.aclose()  # aborts the request in the engine if it is still there
            model.withdraw(promise)  # (a stream never begun: its place given back; otherwise nothing)
        if failure is not None:
            self.outcomes.record_error(call, failure)
            if response is None:
                return error_response(failure, request_id, openai=openai)
            # Mid-stream: a last event says why, and the stream ends.
            await response.write(b"event: error\ndata: " + dumps({"error": failure.code, "message": failure.message,
                                                                    "request_id": request_id}) + b"\n\n")
            await response.write_eof()
            return response
        self.outcomes.record(call)
        if not streaming:
            for index, choice in made.items():
                choice.text = "".join(pieces[index])
            choices = [made.get(i) or Choice(tokens=[]) for i in range(overrides.get("n", 1))]
            return WholeResponse(200, dumps(generation.whole(choices, last)), (("X-Request-ID", request_id), ("X-Model-Version", served)))
        if response is None:  # nothing was generated: still a well-formed stream
            response = web.StreamResponse(headers={**_SSE_HEADERS, "X-Request-ID": request_id, "X-Model-Version": served})
            await response.prepare(request)
        if openai:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


def _prompt(model: GenerationModel, promise: Promise, **prompt: Any) -> Awaitable[list[int]]:
    return model.prompt_ids(promise, **prompt)


def _note(stages: Generated, delta: Any) -> None:
    """A traced generation's progress: its first token's time, then its last's, its tokens, how it ended."""
    now = time.monotonic()
    if not stages.first_token_at:
        stages.first_token_at = now
    stages.finished_at = now
    stages.completion_tokens += delta.token_count
    if delta.finished:
        stages.finish_reason = delta.finish_reason


def _usage(last: Any) -> dict[str, int]:
    prompt = last.prompt_tokens if last is not None else 0
    completion = last.completion_tokens if last is not None else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

