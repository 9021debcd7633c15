"""The wire format of OpenAI's `/v1/completions` and `/v1/chat/completions`: the request body, and the
answer whole or as stream chunks, the way the official `openai` client and its stream helpers read them.

Kept apart from the handler (`generation.py`) as `inference_body` and `embeddings` are for their endpoints.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from ..errors import InvalidInput

if TYPE_CHECKING:
    from ..models.generation import ToolPlan

# Fields the engine path cannot honour yet: refused with a 400 rather than silently ignored.
_UNSUPPORTED = ("functions", "function_call", "logit_bias", "echo", "best_of", "suffix")
_CHAT_ONLY = ("tools", "tool_choice", "parallel_tool_calls")


@dataclass(slots=True)
class TextBody:
    """A parsed completion or chat body: the prompt (text) or the messages, and their length in characters."""

    chat: bool
    prompt: str = ""
    messages: list[dict[str, Any]] = field(default_factory=list)
    chars: int = 0
    include_usage: bool = False
    logprobs: int | None = None  # how many most likely tokens to show beside each generated one; None: no logprobs
    structured: dict[str, Any] | None = None  # `response_format` as vLLM's structured outputs, or vLLM's own; None: free text


def parse_text_call(body: dict[str, Any], chat: bool) -> TextBody:
    for key in _UNSUPPORTED:
        if body.get(key) not in (None, False):
            raise InvalidInput(f"`{key}` is not supported by this server")
    for key in () if chat else _CHAT_ONLY:
        if body.get(key) is not None:
            raise InvalidInput(f"`{key}` is for /v1/chat/completions")
    options = body.get("stream_options")  # (its shape is checked with the sampling fields)
    include_usage = isinstance(options, dict) and options.get("include_usage") is True
    logprobs, structured = _logprobs(body, chat), _structured(body.get("response_format"))
    own = body.get("structured_outputs")  # vLLM's own (choice, regex, grammar, json): checked with the sampling fields
    if own is not None:
        if structured is not None:
            raise InvalidInput("`response_format` and `structured_outputs` cannot both hold the output: send one")
        structured = own
    if chat:
        messages = [_message(m, i) for i, m in enumerate(_non_empty_list(body.get("messages")))]
        # every string that reaches the chat template counts against `max_input_chars`, roles too
        return TextBody(True, messages=messages, chars=sum(_chars(m) for m in messages),
                        include_usage=include_usage, logprobs=logprobs, structured=structured)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1:
        prompt = prompt[0]
    if not isinstance(prompt, str):
        raise InvalidInput("`prompt` must be a string (or a list holding one)")
    return TextBody(False, prompt=prompt, chars=len(prompt), include_usage=include_usage, logprobs=logprobs,
                    structured=structured)


def _structured(response_format: Any) -> dict[str, Any] | None:
    """OpenAI's `response_format` as vLLM's structured outputs: `json_object` (any JSON object) or
    `json_schema` (`{"json_schema": {"name", "schema"}}`: output that validates against the schema)."""
    if response_format is None or response_format == {"type": "text"}:
        return None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "json_object":
        return {"json_object": True}
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        if not isinstance(spec, dict) or not isinstance(spec.get("schema"), dict):
            raise InvalidInput("`response_format.json_schema.schema` must be a JSON schema (an object)")
        return {"json": spec["schema"]}
    raise InvalidInput('`response_format.type` must be "text", "json_object" or "json_schema"')


MAX_LOGPROBS = 20  # (vLLM's own default `max_logprobs`)


def _logprobs(body: dict[str, Any], chat: bool) -> int | None:
    """How many alternatives to show per token, as each API asks: chat `logprobs: true` with
    `top_logprobs: k`; completions `logprobs: k`. None: not asked."""
    def count(key: str) -> int:
        value = body[key]
        if type(value) is not int or not 0 <= value <= MAX_LOGPROBS:
            raise InvalidInput(f"`{key}` must be an integer from 0 to {MAX_LOGPROBS}")
        return value

    if not chat:
        return None if body.get("logprobs") is None else count("logprobs")
    asked = body.get("logprobs")
    if asked not in (None, True, False):
        raise InvalidInput("`logprobs` must be true or false")
    if body.get("top_logprobs") is not None and asked is not True:
        raise InvalidInput("`top_logprobs` needs `logprobs: true`")
    if asked is not True:
        return None
    return 0 if body.get("top_logprobs") is None else count("top_logprobs")


def _non_empty_list(value: Any) -> list[Any]:
    if not isinstance(value, list) or not value:
        raise InvalidInput("`messages` must be a non-empty list of {role, content} objects")
    return value


def _message(message: Any, i: int) -> dict[str, Any]:
    """One chat message; `content` a string or a list of text parts (joined), as OpenAI's clients send;
    an assistant's `tool_calls` (its content may then be null) and a tool's `tool_call_id` go on to the
    chat template as given."""
    if not isinstance(message, dict) or not isinstance(message.get("role"), str):
        raise InvalidInput(f"`messages[{i}]` must be an object with a string `role`")
    content = message.get("content")
    if isinstance(content, list):
        if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str) for p in content):
            raise InvalidInput(f"`messages[{i}].content`: only text parts ({{\"type\": \"text\", \"text\": ...}}) are supported")
        content = "".join(p["text"] for p in content)
    calls = message.get("tool_calls")
    if calls is not None and not (isinstance(calls, list) and all(_is_call(c) for c in calls)):
        raise InvalidInput(f"`messages[{i}].tool_calls` must be a list of {{id, type, function: {{name, arguments}}}}")
    if not isinstance(content, str) and not (content is None and calls):
        raise InvalidInput(f"`messages[{i}].content` must be a string or a list of text parts")
    kept: dict[str, Any] = {"role": message["role"], "content": content}
    if calls:
        kept["tool_calls"] = calls
    for key in ("tool_call_id", "name"):
        if message.get(key) is not None:
            if not isinstance(message[key], str):
                raise InvalidInput(f"`messages[{i}].{key}` must be a string")
            kept[key] = message[key]
    return kept


def _is_call(call: Any) -> bool:
    function = call.get("function") if isinstance(call, dict) else None
    return isinstance(function, dict) and isinstance(function.get("name"), str) and isinstance(function.get("arguments"), str)


def _chars(message: dict[str, Any]) -> int:
    """What a message brings to the chat template, in characters (its tool calls' names and arguments too)."""
    calls = message.get("tool_calls") or ()
    return (len(message["role"]) + len(message["content"] or "") + len(message.get("tool_call_id", ""))
            + sum(len(c["function"]["name"]) + len(c["function"]["arguments"]) for c in calls))


@dataclass(slots=True)
class Choice:
    """One of a request's choices, whole: its text, how it ended, its tokens' logprobs (when asked)."""

    text: str = ""
    finish_reason: str | None = None
    tokens: list[Any] | None = None


class TextAnswer:
    """Builds the answer of one call: whole, or chunk by chunk (the role in the first delta only, the
    usage in a final chunk of its own with no choices when `stream_options.include_usage`)."""

    def __init__(self, call: TextBody, model: str, created: int, tools: ToolPlan | None = None) -> None:
        self.call = call
        self.model = model
        self.created = created
        self.tools = tools if tools is not None and tools.reads_calls else None  # (its output read for calls)
        self._called: set[int] = set()  # with "required" or "auto", streamed: the choices whose calls began
        self.id = ("chatcmpl-" if call.chat else "cmpl-") + os.urandom(12).hex()
        self.kind = "chat.completion" if call.chat else "text_completion"
        self._role_sent: set[int] = set()  # the choices whose first delta went (it carries the role)
        self._text_offset: dict[int, int] = {}  # (the completions API's offsets run on across a stream's chunks)

    def whole(self, choices: list[Choice], usage: dict[str, int]) -> dict[str, Any]:
        answers = []
        for index, made in enumerate(choices):
            choice: dict[str, Any] = {"index": index, "finish_reason": made.finish_reason or "stop",
                                      "logprobs": self._logprobs(made.tokens, index)}
            if self.tools is not None:
                content, calls = self.tools.read(made.text)
                choice["message"] = {"role": "assistant", "content": content, **({"tool_calls": calls} if calls else {})}
                choice["finish_reason"] = self.tools.finish_reason(choice["finish_reason"], bool(calls))
            elif self.call.chat:
                choice["message"] = {"role": "assistant", "content": made.text}
            else:
                choice["text"] = made.text
            answers.append(choice)
        return {"id": self.id, "object": self.kind, "created": self.created, "model": self.model,
                "choices": answers, "usage": usage}

    def chunks(self, text: str, last: Any, usage: dict[str, int]) -> list[dict[str, Any]]:
        """The events of one delta of one choice (`last.index`); after the request's last, the usage.
        With tools: a named call streams as it is written; "required" and "auto" calls as they parse."""
        index = last.index
        if self.tools is not None:
            return self._tool_chunks(text, last, usage)
        reason = last.finish_reason if last.finished else None
        choice: dict[str, Any] = {"index": index, "finish_reason": reason, "logprobs": self._logprobs(last.logprobs, index)}
        if self.call.chat:
            delta: dict[str, str] = {}
            if index not in self._role_sent:
                delta["role"] = "assistant"
                self._role_sent.add(index)
            if text or not last.finished:
                delta["content"] = text
            choice["delta"] = delta
        else:
            choice["text"] = text
        return self._events(choice, last, usage)

    def _events(self, choice: dict[str, Any], last: Any, usage: dict[str, int]) -> list[dict[str, Any]]:
        """A chunk of one choice; after the request's last delta, the usage in a chunk of its own when asked."""
        events = [self._event([choice])]
        if last.done and self.call.include_usage:
            events.append({**self._event([]), "usage": usage})
        return events

    def _tool_chunks(self, text: str, last: Any, usage: dict[str, int]) -> list[dict[str, Any]]:
        tools = self.tools
        assert tools is not None
        if tools.choice == "named":  # the text is the call's arguments: streamed as they come
            return self._named_call_chunks(tools, text, last, usage)
        return self._parsed_call_chunks(tools, text, last, usage)

    def _named_call_chunks(self, tools: ToolPlan, text: str, last: Any, usage: dict[str, int]) -> list[dict[str, Any]]:
        """A forced function's call, streamed: its id and name in the choice's first chunk, then its
        arguments as the model writes them (as OpenAI streams a call)."""
        index = last.index
        call: dict[str, Any] = {"index": 0, "function": {"arguments": text}}
        delta: dict[str, Any] = {"tool_calls": [call]}
        if index not in self._role_sent:
            self._role_sent.add(index)
            delta["role"] = "assistant"
            call.update(id=f"call_{os.urandom(12).hex()}", type="function")
            call["function"]["name"] = tools.name
        reason = tools.finish_reason(last.finish_reason, True) if last.finished else None
        return self._events({"index": index, "delta": delta, "logprobs": self._logprobs(last.logprobs, index),
                             "finish_reason": reason}, last, usage)

    def _parsed_call_chunks(self, tools: ToolPlan, text: str, last: Any, usage: dict[str, int]) -> list[dict[str, Any]]:
        """"required"'s or "auto"'s content and calls, streamed as vLLM's readers parse them (the first
        step sends the role; a later one that completes nothing sends nothing, unless it carries
        logprobs or ends the choice)."""
        index = last.index
        content, calls = tools.stream(index, text, last.token_ids, last.finished)
        delta: dict[str, Any] = {}
        if index not in self._role_sent:
            self._role_sent.add(index)
            delta["role"] = "assistant"
        if content:
            delta["content"] = content
        if calls:
            delta["tool_calls"] = calls
            self._called.add(index)
        reason = None
        if last.finished:
            reason = tools.finish_reason(last.finish_reason, index in self._called)
        if not delta and not last.finished and not last.logprobs:
            return []
        return self._events({"index": index, "delta": delta, "logprobs": self._logprobs(last.logprobs, index),
                             "finish_reason": reason}, last, usage)

    def _logprobs(self, tokens: list[Any] | None, index: int) -> dict[str, Any] | None:
        """Tokens' logprobs in the shape of the call's API (chat's `content` list, or the completions
        API's parallel lists with text offsets); None when the call did not ask."""
        if self.call.logprobs is None or tokens is None:
            return None
        if self.call.chat:
            return {"content": [{"token": t.token, "logprob": t.logprob, "bytes": list(t.token.encode()),
                                 "top_logprobs": [{"token": s, "logprob": lp, "bytes": list(s.encode())} for s, lp in t.top]}
                                for t in tokens]}
        offsets, at = [], self._text_offset.get(index, 0)
        for t in tokens:
            offsets.append(at)
            at += len(t.token)
        self._text_offset[index] = at
        return {"tokens": [t.token for t in tokens], "token_logprobs": [t.logprob for t in tokens],
                "top_logprobs": [dict(t.top) for t in tokens], "text_offset": offsets}

    def _event(self, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": self.id, "object": f"{self.kind}.chunk" if self.call.chat else self.kind,
                "created": self.created, "model": self.model, "choices": choices}
