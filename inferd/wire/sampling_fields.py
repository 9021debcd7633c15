"""A generation request's sampling fields (OpenAI's and vLLM's names), each checked before any engine
sees it: a bad value is a 400 naming the field."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..errors import InvalidInput


def sampling_fields(body: dict[str, Any]) -> dict[str, Any]:
    """A generation request's sampling fields, each checked here: a bad value is a 400 naming it, never
    an engine error. (Checked on a batch model's request too, where they are ignored: a body is valid or
    not whatever model it goes to.)"""
    if body.get("max_completion_tokens") is not None:
        body = {**body, "max_tokens": body["max_completion_tokens"]}
    overrides = {}
    for key, (fits, what) in _SAMPLING_FIELDS.items():
        value = body.get(key)
        if value is None:
            continue
        if not fits(value):
            raise InvalidInput(f"`{key}` must be {what}, got {str(value)[:40]}")
        overrides[key] = value
    if "min_tokens" in overrides and overrides["min_tokens"] > overrides.get("max_tokens", math.inf):
        raise InvalidInput(f"`min_tokens` must be at most `max_tokens` ({overrides['max_tokens']})")
    seed = overrides.get("seed")  # (choice i samples with seed + i: each must fit a signed 64-bit integer)
    if seed is not None and not -(2**63) <= seed <= 2**63 - overrides.get("n", 1):
        raise InvalidInput(f"`seed` must fit in 64 bits with `n` choices (seed + n - 1 < 2^63), got {str(seed)[:40]}")
    for key, (fits, what) in _LABELS.items():
        if body.get(key) is not None and not fits(body[key]):
            raise InvalidInput(f"`{key}` must be {what}, got {str(body[key])[:40]}")
    if not isinstance(body.get("stream", False), bool):
        raise InvalidInput("`stream` must be true or false")
    options = body.get("stream_options")
    if options is not None and not (isinstance(options, dict) and isinstance(options.get("include_usage", False), bool)):
        raise InvalidInput("`stream_options` must be an object like {\"include_usage\": true}")
    return overrides


MAX_CHOICES = 16  # `n`: each choice is a sequence of its own in the engine's batch (OpenAI allows 128)
_STRUCTURED = frozenset({"json", "regex", "choice", "grammar", "json_object"})


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


_SAMPLING_FIELDS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "n": (lambda v: _integer(v) and 1 <= v <= MAX_CHOICES, f"an integer from 1 to {MAX_CHOICES}"),  # (choices per prompt)
    "max_tokens": (lambda v: _integer(v) and v >= 1, "an integer >= 1"),
    "temperature": (lambda v: _number(v) and 0 <= v <= 2, "a number from 0 to 2"),
    "top_p": (lambda v: _number(v) and 0 < v <= 1, "a number above 0, at most 1"),
    "seed": (_integer, "an integer"),
    "stop": (lambda v: (isinstance(v, str) and v != "") or (
        isinstance(v, list) and len(v) <= 4 and all(isinstance(s, str) and s for s in v)),
             "a non-empty string or a list of at most 4 of them"),
    "ignore_eos": (lambda v: isinstance(v, bool), "true or false"),
    "frequency_penalty": (lambda v: _number(v) and -2 <= v <= 2, "a number from -2 to 2"),
    "presence_penalty": (lambda v: _number(v) and -2 <= v <= 2, "a number from -2 to 2"),
    "repetition_penalty": (lambda v: _number(v) and 0 < v <= 2, "a number above 0, at most 2"),
    "top_k": (lambda v: _integer(v) and (v == -1 or v >= 0), "an integer >= 0 (0 or -1: off)"),
    "min_p": (lambda v: _number(v) and 0 <= v <= 1, "a number from 0 to 1"),
    "min_tokens": (lambda v: _integer(v) and v >= 0, "an integer >= 0"),  # (vLLM's: no stop before this many)
    "logprobs": (lambda v: _integer(v) and 0 <= v <= 20, "an integer from 0 to 20"),  # (alternatives per token)
    "skip_special_tokens": (lambda v: isinstance(v, bool), "true or false"),  # (vLLM's: special tokens in the text)
    # vLLM's own extra field (its server takes it too): one of json, regex, choice, grammar, json_object
    "structured_outputs": (lambda v: isinstance(v, dict) and len(v) == 1 and set(v) <= _STRUCTURED,
                           "an object with one of choice, grammar, json, json_object, regex"),
}
_LABELS = {"user": (lambda v: isinstance(v, str), "a string")}  # OpenAI's, accepted and not used: checked all the same
