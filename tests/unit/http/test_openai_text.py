"""OpenAI's text calls as inferd reads them: what counts against a model's character limit."""

from __future__ import annotations

import pytest

from inferd.errors import InvalidInput
from inferd.http.openai_text import parse_text_call


def test_every_string_that_reaches_the_chat_template_counts_roles_too():
    call = parse_text_call({"messages": [{"role": "r" * 1_000_000, "content": ""}]}, chat=True)
    assert call.chars == 1_000_000  # a huge role with empty content is not a free pass past max_input_chars
    parts = {"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]}
    assert parse_text_call({"messages": [parts]}, chat=True).chars == len("user") + 4
    assert parse_text_call({"prompt": ["one prompt"]}, chat=False).chars == len("one prompt")


def test_a_message_without_a_string_role_is_a_400():
    with pytest.raises(InvalidInput):
        parse_text_call({"messages": [{"role": 5, "content": "x"}]}, chat=True)
