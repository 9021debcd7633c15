"""Tool calls on `/v1/chat/completions` (OpenAI's `tools`, `tool_choice`, `parallel_tool_calls`), with
vLLM's own code wherever it has it:

- the tools and the choice are read by vLLM's request model (`ChatCompletionRequest`), so a request is
  refused where `vllm serve` refuses it, with its reason;
- a forced choice (a named function, or "required") holds the output to the JSON schema that vLLM's
  `get_json_schema_from_tools` gives (as structured outputs): the function's arguments, or a list of
  `{name, parameters}`; the calls are read back from that JSON, as vLLM's server reads them (streamed
  as they parse, by vLLM's own streaming reader);
- "auto" leaves the model free and reads its own tool-call format with the vLLM tool parser that the
  model's `tool_call_parser` option names (e.g. "hermes"), as `vllm serve --enable-auto-tool-choice
  --tool-call-parser NAME` does; without one, "auto" with tools is refused, as vLLM's server refuses it.
  Streamed, each step's text and token ids go through vLLM's own per-stream `Parser` (`parse_delta`,
  what its server calls), so content and calls come as vLLM's server sends them.

The tools also reach the chat template (`tools=`), for the models whose template describes them.
Importing vLLM's server modules takes seconds: `preload()` runs at the engine's start, off the loop.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


def preload() -> None:
    """Import vLLM's request model and tool parsers now (seconds), not on the first request with tools."""
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # noqa: F401
    from vllm.parser.parser_manager import ParserManager  # noqa: F401
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager  # noqa: F401


def check_parser(name: str) -> None:
    """A `tool_call_parser` vLLM does not know: the model's start-up fails, saying which it knows."""
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    if name not in ToolParserManager.list_registered():
        raise ValueError(f"inferd.backends.vllm: `tool_call_parser` {name!r} is no vLLM tool parser; "
                         f"known: {', '.join(ToolParserManager.list_registered())}")


@dataclass
class ToolPlan:
    """What a chat request asked of its tools, and how its output is read back."""

    choice: str  # none | auto | required | named
    tools: list[dict[str, Any]]  # as the client gave them (for the chat template)
    schema: dict[str, Any] | None  # the structured output a forced choice is held to
    name: str | None = None  # the function a named choice forces
    request: Any = None  # vLLM's ChatCompletionRequest (what its tool parsers read)
    parser: Any = None  # auto: the vLLM tool parser, one per request (parsers keep state)
    keep_special_tokens: bool = False  # auto: the parser needs them (e.g. hermes' <tool_call> tags)
    stream_parser: Any = None  # auto: vLLM's `Parser` class for the named tool parser (one per streamed choice)
    tokenizer: Any = None  # auto: the tokenizer its parsers read with
    _streams: dict[int, Any] = field(default_factory=dict)  # streamed, by choice: its parser, or its text so far

    @property
    def forced(self) -> bool:
        return self.choice in ("named", "required")

    @property
    def reads_calls(self) -> bool:
        """Whether the output is read for calls."""
        return self.choice != "none"

    def stream(self, index: int, text: str, token_ids: Sequence[int], finished: bool) -> tuple[str | None, list[dict[str, Any]]]:
        """One step of choice `index`, streamed ("required" or "auto"): the content and the `tool_calls`
        deltas it completes, in OpenAI's streamed shape (a call's index, id and name first, then its
        arguments as they come).
        "required": vLLM's own `extract_required_tool_call_streaming`, which reads them off the text so
        far and before. "auto": vLLM's `Parser.parse_delta` for the named tool parser (text and token
        ids; at the end, any arguments it parsed but had not sent)."""
        if self.choice == "required":
            from vllm.tool_parsers.streaming import extract_required_tool_call_streaming

            previous = self._streams.get(index, "")
            self._streams[index] = previous + text
            message, _ = extract_required_tool_call_streaming(previous_text=previous, current_text=previous + text,
                                                              tool_call_idx=None, tool_call_id_type="random")
        else:
            parser = self._streams.get(index)
            if parser is None:
                parser = self._streams[index] = self.stream_parser(self.tokenizer, self.request.tools)
            # (no reasoning parser: any prompt ids tell it the output is not reasoning)
            message = parser.parse_delta(text, list(token_ids), self.request, prompt_token_ids=[], finished=finished)
        if message is None:
            return None, []
        return message.content or None, [call.model_dump(exclude_none=True) for call in message.tool_calls or ()]

    def read(self, text: str) -> tuple[str | None, list[dict[str, Any]]]:
        """The content and the tool calls in OpenAI's shape (`id`, `type`, `function.name`,
        `function.arguments` as a JSON string) of one choice's whole text."""
        if self.choice == "named":
            return None, [_call(self.name or "", text)]
        if self.choice == "required":
            try:
                listed = json.loads(text)
            except ValueError:  # cut short (max_tokens): nothing to call, the text kept
                return text, []
            calls = [_call(item["name"], json.dumps(item.get("parameters", {}), ensure_ascii=False))
                     for item in listed if isinstance(item, dict) and isinstance(item.get("name"), str)]
            return None, calls
        if self.choice == "auto":
            found = self.parser.extract_tool_calls(text, request=self.request)
            if not found.tools_called:
                return text, []
            return found.content or None, [_call(c.function.name, c.function.arguments) for c in found.tool_calls]
        return text, []

    def finish_reason(self, reason: str | None, called: bool) -> str | None:
        """OpenAI's: "tool_calls" when the model chose to call ("auto", "required"); a named call
        keeps "stop"."""
        if called and reason == "stop" and self.choice in ("auto", "required"):
            return "tool_calls"
        return reason


def plan(body: dict[str, Any], parser_name: str | None, tokenizer: Any) -> ToolPlan | None:
    """The request's tools read as vLLM reads them; None when it names none. ValueError (the client's
    mistake, said as vLLM says it) when vLLM's server would refuse them."""
    if body.get("tools") is None and body.get("tool_choice") is None:
        return None
    from pydantic import ValidationError
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest
    from vllm.exceptions import VLLMClientError
    from vllm.tool_parsers.utils import get_json_schema_from_tools

    fields = {key: body[key] for key in ("tools", "tool_choice", "parallel_tool_calls") if body.get(key) is not None}
    try:
        request = ChatCompletionRequest.model_validate({"model": "-", "messages": [{"role": "user", "content": ""}],
                                                        **fields})
    except ValidationError as exc:
        raise ValueError("; ".join(f"`{'.'.join(map(str, e['loc']))}`: {e['msg']}" for e in exc.errors())[:500]) from None
    except (VLLMClientError, ValueError) as exc:  # (vLLM's own validation error)
        raise ValueError(str(exc)[:500]) from None
    tools = list(body.get("tools") or [])
    choice: Any = request.tool_choice  # (vLLM's types: a str or a named choice, both checked by its request model)
    given: Any = request.tools
    if isinstance(choice, str):
        if choice == "none" or not tools:
            return ToolPlan("none", tools, None)
        if choice == "auto":
            return _auto(request, tools, parser_name, tokenizer)
        return ToolPlan("required", tools, _schema(get_json_schema_from_tools(choice, given, request.parallel_tool_calls)))
    return ToolPlan("named", tools, _schema(get_json_schema_from_tools(choice, given)), name=choice.function.name)


def _auto(request: Any, tools: list[dict[str, Any]], parser_name: str | None, tokenizer: Any) -> ToolPlan:
    if parser_name is None:
        raise ValueError('`tool_choice` "auto" needs a tool-call parser: this model has no `tool_call_parser` '
                         'option (a vLLM tool parser, e.g. "hermes"); a named function or "required" works without')
    from vllm.parser.parser_manager import ParserManager
    from vllm.tool_parsers.abstract_tool_parser import ToolParserManager

    parser = ToolParserManager.get_tool_parser(parser_name)(tokenizer, request.tools)
    request = parser.adjust_request(request)
    return ToolPlan("auto", tools, None, request=request, parser=parser,
                    keep_special_tokens=not getattr(request, "skip_special_tokens", True),
                    stream_parser=ParserManager.get_parser(tool_parser_name=parser_name, enable_auto_tools=True),
                    tokenizer=tokenizer)


def _schema(schema: Any) -> dict[str, Any]:
    return json.loads(schema) if isinstance(schema, str) else schema


def _call(name: str, arguments: str) -> dict[str, Any]:
    return {"id": f"call_{os.urandom(12).hex()}", "type": "function", "function": {"name": name, "arguments": arguments}}
