"""The dead-letter log."""

from __future__ import annotations

from inferd.messages import PendingRequest
from inferd.observability.dead_letters import DeadLetters


def test_dead_letters_keep_a_hash_and_length_never_the_input():
    letters = DeadLetters(capacity=2)
    for i in range(3):
        request = PendingRequest(f"r{i}", f"secret input {i}", 0.0, 1.0, None)  # type: ignore[arg-type]
        letters.add(request, "m", ValueError("poison"))
    entries = letters.entries()
    assert letters.total == 3 and [e["request_id"] for e in entries] == ["r1", "r2"]  # bounded
    assert all("secret" not in str(e) for e in entries)
    assert entries[0]["input_length"] == len("secret input 1") and entries[0]["error"] == "ValueError: poison"
