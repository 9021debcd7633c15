"""OpenAI's text calls as inferd reads them: what counts against a model's character limit."""

from __future__ import annotations

import pytest

from inferd.errors import InvalidInput
from inferd.wire.openai_text import parse_text_call


def test_every_string_that_reaches_the_chat_template_counts_roles_too():
    call = parse_text_call({"messages": [{"role": "r" * 1_000_000, "content": ""}]}, chat=True)
    assert call.chars == 1_000_000  # a huge role with empty content is not a free pass past max_input_chars
    parts = {"role": "user", "content": [{"type": "text", "text": "ab"}, {"type": "text", "text": "cd"}]}
    assert parse_text_call({"messages": [parts]}, chat=True).chars == len("user") + 4
    assert parse_text_call({"prompt": ["one prompt"]}, chat=False).chars == len("one prompt")


def test_a_message_without_a_string_role_is_a_400():
    with pytest.raises(InvalidInput):
        parse_text_call({"messages": [{"role": 5, "content": "x"}]}, chat=True)


def test_the_chunks_of_two_choices_carry_their_index_the_role_once_each_and_the_usage_after_the_last():
    from inferd.backends.contract import Delta
    from inferd.wire.openai_text import Choice, TextAnswer

    answer = TextAnswer(parse_text_call({"messages": [{"role": "user", "content": "hi"}],
                                         "stream_options": {"include_usage": True}}, chat=True), "m", 0)
    usage = {"prompt_tokens": 1, "completion_tokens": 4, "total_tokens": 5}
    steps = [Delta("a", 1, False, index=0), Delta("b", 1, False, index=1), Delta("c", 1, True, "length", index=1),
             Delta("d", 1, True, "stop", index=0, done=True)]
    events = [e for step in steps for e in answer.chunks(step.text, step, usage)]
    choices = [e["choices"][0] for e in events if e["choices"]]
    assert [(c["index"], c["delta"].get("role"), c["delta"]["content"], c["finish_reason"]) for c in choices] == [
        (0, "assistant", "a", None), (1, "assistant", "b", None), (1, None, "c", "length"), (0, None, "d", "stop")]
    assert [e.get("usage") for e in events] == [None, None, None, None, usage]  # once, after the request's last delta
    whole = answer.whole([Choice("ad", "stop"), Choice("bc", "length")], usage)
    assert [(c["index"], c["message"]["content"], c["finish_reason"]) for c in whole["choices"]] == [
        (0, "ad", "stop"), (1, "bc", "length")]


def test_vllms_own_structured_outputs_are_kept_and_one_way_at_a_time():
    call = parse_text_call({"prompt": "pick", "structured_outputs": {"choice": ["yes", "no"]}}, chat=False)
    assert call.structured == {"choice": ["yes", "no"]}
    chat = parse_text_call({"messages": [{"role": "user", "content": "x"}], "structured_outputs": {"regex": "a+"},
                            "response_format": {"type": "text"}}, chat=True)
    assert chat.structured == {"regex": "a+"}
    with pytest.raises(InvalidInput, match="cannot both"):
        parse_text_call({"prompt": "x", "structured_outputs": {"regex": "a+"}, "response_format": {"type": "json_object"}},
                        chat=False)
