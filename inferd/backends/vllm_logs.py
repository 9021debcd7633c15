"""vLLM's own log lines at a size an operator reads: a line over `LONGEST_LINE` characters is cut there
and says how much was left out.

Why: every engine start logged its whole configuration at INFO, one line of ~3.3 KB (`Initializing a
V1 LLM engine ... with config: ...`), in the engine's own process, which configures vLLM's logging
afresh from its environment. So the cut is a logging filter named in a dictConfig file that vLLM
loads in every process it starts (`VLLM_LOGGING_CONFIG_PATH`): vLLM's default configuration, as it
would make it itself, plus this filter on its handler. An operator who configures vLLM's logging
(`VLLM_LOGGING_CONFIG_PATH`, `VLLM_CONFIGURE_LOGGING=0`) or asks for DEBUG gets vLLM's lines whole.
"""

from __future__ import annotations

import atexit
import copy
import json
import logging
import os
import tempfile
from typing import Any

LONGEST_LINE = 600  # characters of a message kept at INFO and above (vLLM's longest other lines: ~280)
_CONFIG_PATH = "VLLM_LOGGING_CONFIG_PATH"


class LongLinesCut(logging.Filter):
    """Cuts a record's message to `longest` characters, saying how many were left out."""

    def __init__(self, longest: int = LONGEST_LINE) -> None:
        super().__init__()
        self.longest = longest

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if len(message) > self.longest:
            left_out = len(message) - self.longest
            record.msg = f"{message[:self.longest]} ... [{left_out} characters more at VLLM_LOGGING_LEVEL=DEBUG]"
            record.args = None
        return True


def cut_long_lines() -> None:
    """Before an engine starts (vLLM imported): long lines cut in this process and, through the
    config file named in the environment, in the processes vLLM starts. Once per process; nothing
    where the operator configures vLLM's logging or asks for DEBUG."""
    if os.environ.get(_CONFIG_PATH) or os.environ.get("VLLM_CONFIGURE_LOGGING", "1") == "0":
        return
    if os.environ.get("VLLM_LOGGING_LEVEL", "INFO").upper() == "DEBUG":
        return
    from vllm.logger import DEFAULT_LOGGING_CONFIG

    handlers = logging.getLogger("vllm").handlers
    for handler in handlers:
        if not any(isinstance(f, LongLinesCut) for f in handler.filters):
            handler.addFilter(LongLinesCut())
    config = with_long_lines_cut(DEFAULT_LOGGING_CONFIG)
    try:
        fd, path = tempfile.mkstemp(prefix="inferd-vllm-logging-", suffix=".json")
        with os.fdopen(fd, "w") as file:
            json.dump(config, file)
    except (OSError, TypeError, ValueError) as exc:  # (no writable temporary folder: the lines stay whole)
        logging.getLogger("inferd.generation").warning("vLLM's long log lines stay whole: %s", exc)
        return
    os.environ[_CONFIG_PATH] = path
    atexit.register(_remove, path)


def with_long_lines_cut(default: dict[str, Any]) -> dict[str, Any]:
    """vLLM's default logging configuration with `LongLinesCut` on each of its handlers."""
    config = copy.deepcopy(default)
    config.setdefault("filters", {})["inferd_long_lines"] = {"()": f"{__name__}.LongLinesCut"}
    for handler in config.get("handlers", {}).values():
        handler["filters"] = [*handler.get("filters", []), "inferd_long_lines"]
    return config


def _remove(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass
