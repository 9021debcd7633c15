"""HTTP for generation models: `/v1/inference` (whole text or Server-Sent Events) and the
OpenAI-compatible `/v1/completions` and `/v1/chat/completions`, so the official `openai` client works
against inferd unchanged.

Each request: identify the caller, check the model's waiting bounds (before tokenising), tokenise
(applying the chat template for chat), then consume the engine's deltas under the request's deadline.
A passed deadline aborts the request in the engine and answers 504 (or, mid-stream, a final error
event); a client that goes away aborts it too.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import orjson
from aiohttp import web

from .admission import Admission
from .auth import Authenticator
from .errors import DeadlineExceeded, InferdError, InvalidInput, ModelNotFound, PayloadTooLarge
from .generation import GenerationModel
from .responses import dumps

Record = Callable[[str, str, str, int, str, float], None]
ErrorResponse = Callable[[InferdError, str], web.Response]

_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class GenerationApi:
    def __init__(
        self,
        *,
        models: dict[str, GenerationModel],
        admission: Admission,
        auth: Authenticator,
        tier_priority: dict[str, int],
        max_body_bytes: int,
        record: Record,
        error_response: ErrorResponse,
        pick_id: Callable[[str | None], str],
    ) -> None:
        self.models = models
        self.admission = admission
        self.auth = auth
        self.tier_priority = tier_priority
        self.max_body_bytes = max_body_bytes
        self.record = record
        self.error_response = error_response
        self.pick_id = pick_id

    # ---- the three request shapes ----------------------------------------------------------------

    async def inference(self, request: web.BaseRequest, model: GenerationModel, body: dict[str, Any],
                        request_id: str, started: float) -> web.StreamResponse:
        """inferd's own shape: {"input": text} -> {"output": text}, or SSE with {"stream": true}."""
        def whole(text: str, last: Any) -> dict[str, Any]:
            return {"output": text, "request_id": request_id, "model": model.name,
                    "latency_ms": round((time.monotonic() - started) * 1000, 3),
                    "finish_reason": last.finish_reason, "usage": _usage(last)}

        def chunk(text: str, last: Any) -> dict[str, Any]:
            event: dict[str, Any] = {"delta": text, "request_id": request_id}
            if last.finished:
                event.update(done=True, finish_reason=last.finish_reason, usage=_usage(last))
            return event

        return await self._serve(request, model, body, request_id, started, lambda: model.engine.encode(body["input"]),
                                 whole, chunk, done_marker=False)

    async def completions(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.BaseRequest) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.BaseRequest, chat: bool) -> web.StreamResponse:
        started = time.monotonic()
        request_id = self.pick_id(request.headers.get("X-Request-ID") or request.headers.get("Idempotency-Key"))
        try:
            body = await _read_json(request, self.max_body_bytes)
            model = self.models.get(body.get("model") or "")
            if model is None:
                raise ModelNotFound(f"no generation model named {body.get('model')!r}; see GET /v1/models")
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages or not all(
                    isinstance(m, dict) and isinstance(m.get("content"), str) for m in messages
                ):
                    raise InvalidInput("`messages` must be a non-empty list of {role, content} objects")
                encode = lambda: model.engine.encode_chat(messages)  # noqa: E731
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1:
                    prompt = prompt[0]
                if not isinstance(prompt, str):
                    raise InvalidInput("`prompt` must be a string")
                encode = lambda: model.engine.encode(prompt)  # noqa: E731
            if body.get("n", 1) != 1:
                raise InvalidInput("only n = 1 is supported")
        except InferdError as error:
            self.record(request_id, "-", "-", error.status, error.code, started)
            return self.error_response(error, request_id)
        created = int(time.time())
        kind = "chat.completion" if chat else "text_completion"

        def whole(text: str, last: Any) -> dict[str, Any]:
            choice: dict[str, Any] = {"index": 0, "finish_reason": last.finish_reason, "logprobs": None}
            if chat:
                choice["message"] = {"role": "assistant", "content": text}
            else:
                choice["text"] = text
            return {"id": request_id, "object": kind, "created": created, "model": model.name,
                    "choices": [choice], "usage": _usage(last)}

        def chunk(text: str, last: Any) -> dict[str, Any]:
            reason = last.finish_reason if last.finished else None
            choice: dict[str, Any] = {"index": 0, "finish_reason": reason, "logprobs": None}
            if chat:
                choice["delta"] = {"role": "assistant", "content": text} if text or not last.finished else {}
            else:
                choice["text"] = text
            event = {"id": request_id, "object": f"{kind}.chunk" if chat else kind, "created": created,
                     "model": model.name, "choices": [choice]}
            if last.finished and (body.get("stream_options") or {}).get("include_usage"):
                event["usage"] = _usage(last)
            return event

        return await self._serve(request, model, body, request_id, started, encode, whole, chunk, done_marker=True)

    # ---- one generation, whole or streamed -------------------------------------------------------

    async def _serve(self, request: web.BaseRequest, model: GenerationModel, body: dict[str, Any], request_id: str,
                     started: float, encode: Callable[[], list[int]], whole: Callable[[str, Any], dict],
                     chunk: Callable[[str, Any], dict], *, done_marker: bool) -> web.StreamResponse:
        tier = "-"
        try:
            self.admission.check_open()
            who = self.auth.identify(request.headers)
            tier = who.tier
            self.admission.limiter.check(who, model.name, 1.0, time.monotonic())
            model.check_capacity()  # before any tokenising
            prompt_ids = encode()
            if len(prompt_ids) >= model.engine.max_model_len:
                raise InvalidInput(f"prompt is {len(prompt_ids)} tokens; model {model.name} takes fewer than "
                                   f"{model.engine.max_model_len}")
            sampling = model.engine.sampling(_sampling_overrides(body))
            timeout_s = _timeout_s(body, model)
        except InferdError as error:
            self.record(request_id, model.name, tier, error.status, error.code, started)
            return self.error_response(error, request_id)
        except (TypeError, ValueError) as exc:
            error = InvalidInput(f"bad sampling parameters: {exc}")
            self.record(request_id, model.name, tier, 400, error.code, started)
            return self.error_response(error, request_id)
        deltas = model.stream(request_id, prompt_ids, sampling, self.tier_priority.get(tier, 0))
        streaming = bool(body.get("stream"))
        response: web.StreamResponse | None = None
        pieces: list[str] = []
        last = None
        try:
            async with asyncio.timeout(timeout_s):
                async for delta in deltas:
                    last = delta
                    if not streaming:
                        pieces.append(delta.text)
                        continue
                    if response is None:
                        response = web.StreamResponse(headers={**_SSE_HEADERS, "X-Request-ID": request_id})
                        await response.prepare(request)
                    await response.write(b"data: " + dumps(chunk(delta.text, delta)) + b"\n\n")
        except TimeoutError:
            model.record_abort("deadline")
            error = DeadlineExceeded(f"deadline of {timeout_s * 1000:.0f} ms passed during generation; aborted")
            self.record(request_id, model.name, tier, 504, error.code, started)
            if response is None:
                return self.error_response(error, request_id)
            await response.write(b"event: error\ndata: " + dumps({"error": error.code, "message": error.message,
                                                                   "request_id": request_id}) + b"\n\n")
            await response.write_eof()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            model.record_abort("client_disconnect")
            self.record(request_id, model.name, tier, 499, "CLIENT_DISCONNECTED", started)
            raise
        finally:
            await deltas.aclose()  # aborts the request in the engine if it is still there
        self.record(request_id, model.name, tier, 200, "", started)
        if not streaming:
            return web.Response(body=dumps(whole("".join(pieces), last)),
                                headers={"Content-Type": "application/json", "X-Request-ID": request_id})
        if response is None:  # nothing was generated: still a well-formed stream
            response = web.StreamResponse(headers={**_SSE_HEADERS, "X-Request-ID": request_id})
            await response.prepare(request)
        if done_marker:
            await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response


async def _read_json(request: web.BaseRequest, max_body_bytes: int) -> dict[str, Any]:
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge:
        raise PayloadTooLarge(f"body exceeds {max_body_bytes} bytes") from None
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise InvalidInput(f"body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise InvalidInput("body must be a JSON object")
    return body


def _sampling_overrides(body: dict[str, Any]) -> dict[str, Any]:
    keys = ("max_tokens", "temperature", "top_p", "seed", "stop", "ignore_eos")
    overrides = {k: body[k] for k in keys if body.get(k) is not None}
    if body.get("max_completion_tokens") is not None:
        overrides["max_tokens"] = body["max_completion_tokens"]
    return overrides


def _timeout_s(body: dict[str, Any], model: GenerationModel) -> float:
    c = model.config
    timeout_ms = body.get("timeout_ms")
    if timeout_ms is None:
        return c.timeout_ms / 1000.0
    if type(timeout_ms) is not int or timeout_ms <= 0:
        raise InvalidInput("`timeout_ms` must be a positive integer")
    return min(timeout_ms, c.max_timeout_ms) / 1000.0


def _usage(last: Any) -> dict[str, int]:
    prompt = last.prompt_tokens if last is not None else 0
    completion = last.completion_tokens if last is not None else 0
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}

