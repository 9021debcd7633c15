"""vLLM's long log lines cut by a filter named in the dictConfig vLLM loads in each of its processes."""

from __future__ import annotations

import io
import logging
import logging.config

from inferd.backends.vllm_logs import LONGEST_LINE, LongLinesCut, with_long_lines_cut

# The shape of vLLM's DEFAULT_LOGGING_CONFIG (a formatter, a stream handler, the `vllm` logger), with a
# plain formatter: what matters is that the filter is added to each handler and works through dictConfig.
DEFAULT = {
    "formatters": {"vllm": {"format": "%(levelname)s %(message)s"}},
    "handlers": {"vllm": {"class": "logging.StreamHandler", "formatter": "vllm", "level": "INFO",
                          "stream": "ext://sys.stderr"}},
    "loggers": {"vllm": {"handlers": ["vllm"], "level": "INFO", "propagate": False}},
    "version": 1,
    "disable_existing_loggers": False,
}


def test_a_long_message_is_cut_and_says_how_much_was_left_out_a_short_one_is_untouched():
    cut = LongLinesCut(longest=20)
    record = logging.LogRecord("vllm.v1.engine.core", logging.INFO, "core.py", 133,
                               "Initializing a V1 LLM engine (v%s) with config: %s", ("0.32.0", "x" * 3000), None)
    whole = record.getMessage()
    assert cut.filter(record)
    assert record.getMessage() == f"Initializing a V1 LL ... [{len(whole) - 20} characters more at VLLM_LOGGING_LEVEL=DEBUG]"
    short = logging.LogRecord("vllm", logging.INFO, "a.py", 1, "ready in %d s", (3,), None)
    assert cut.filter(short) and short.getMessage() == "ready in 3 s"


def test_the_config_vllm_loads_cuts_its_handlers_lines_and_leaves_vllms_own_default_alone():
    config = with_long_lines_cut(DEFAULT)
    assert "filters" not in DEFAULT["handlers"]["vllm"]  # (a copy)
    stream = io.StringIO()
    config["handlers"]["vllm"]["stream"] = stream  # (dictConfig takes a stream object as well as ext://)
    logging.config.dictConfig(config)
    try:
        logger = logging.getLogger("vllm.v1.engine.core")
        logger.info("config: %s", "y" * 5000)
        logger.info("a short line")
    finally:
        logging.getLogger("vllm").handlers.clear()
    first, second = stream.getvalue().splitlines()
    assert len(first) < LONGEST_LINE + 80 and first.endswith("characters more at VLLM_LOGGING_LEVEL=DEBUG]")
    assert second == "INFO a short line"
