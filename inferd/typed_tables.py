"""A TOML table's values checked against the annotations of the dataclass they will build.

TOML has booleans, integers, floats, strings, arrays and tables; a config dataclass says which of
those each field takes (`int`, `float | None`, `tuple[str, ...]`, `Mapping[str, Any]`). A `true` where
a number belongs is a mistake, not 1.
"""

from __future__ import annotations

import difflib
import types
import typing
from collections.abc import Mapping
from dataclasses import fields
from typing import Any


class ConfigError(ValueError):
    """The configuration file is missing, malformed or inconsistent: every problem found (`problems`),
    said in one line."""

    def __init__(self, *problems: str) -> None:
        super().__init__("; ".join(problems))
        self.problems = problems


def first_mistyped(table: Mapping[str, Any], cls: type) -> tuple[str, str] | None:
    """The first key whose value does not fit its field, with what the field takes in words."""
    hints = typing.get_type_hints(cls)
    for key, value in table.items():
        expected = hints.get(key)
        if expected is not None and not _conforms(value, expected):
            return key, _describe(expected)
    return None


def _conforms(value: Any, expected: Any) -> bool:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if expected is Any:
        return True
    if origin in (typing.Union, types.UnionType):
        return any(_conforms(value, arm) for arm in args if arm is not type(None))
    if expected is bool:
        return isinstance(value, bool)
    if expected is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if expected is str:
        return isinstance(value, str)
    if origin is tuple:
        return isinstance(value, (list, tuple)) and all(_conforms(v, args[0]) for v in value)
    if origin is Mapping:
        return isinstance(value, Mapping)
    return True  # a nested table: checked by its own parser


def _describe(expected: Any) -> str:
    origin, args = typing.get_origin(expected), typing.get_args(expected)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(arm) for arm in args if arm is not type(None))
    if origin is tuple:
        return "a list of " + {str: "strings", int: "integers", float: "numbers"}.get(args[0], "values")
    if origin is Mapping:
        return "a table"
    return {bool: "true or false", int: "an integer", float: "a number", str: "a string"}.get(expected, str(expected))


def check_types(table: Mapping[str, Any], cls: type, where: str) -> None:
    """Each value against its field's annotation, so `grace_period_s = "30"` or `devices = "cuda:0"`
    is one line naming the key rather than a traceback later (or six workers, one per character)."""
    wrong = first_mistyped(table, cls)
    if wrong is not None:
        key, expected = wrong
        raise ConfigError(f"{where}: `{key}` must be {expected}, got {table[key]!r}")


def field_names(cls: type) -> set[str]:
    return {f.name for f in fields(cls)}


def reject_unknown(table: Mapping[str, Any], allowed: set[str], where: str) -> None:
    """A ConfigError naming every unknown key, each with the allowed key it is closest to where one is
    close ("did you mean"), and the allowed keys where one is not."""
    unknown = sorted(set(table) - allowed)
    if not unknown:
        return
    guesses = {key: difflib.get_close_matches(key, allowed, n=1, cutoff=0.75) for key in unknown}
    named = [f"{key!r} (did you mean {close[0]!r}?)" if close else repr(key) for key, close in guesses.items()]
    hint = "" if all(guesses.values()) else f"; allowed: {sorted(allowed)}"
    raise ConfigError(f"{where}: unknown keys {', '.join(named)}{hint}")
