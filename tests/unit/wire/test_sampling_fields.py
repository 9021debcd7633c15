"""A generation request's sampling fields, checked before any engine sees them: a bad value is a 400
naming the field."""

from __future__ import annotations

import pytest

from inferd.errors import InvalidInput
from inferd.wire.sampling_fields import sampling_fields


def test_a_seed_must_fit_64_bits_for_every_choice_it_seeds():
    assert sampling_fields({"seed": 2**63 - 2, "n": 2}) == {"seed": 2**63 - 2, "n": 2}
    for body in ({"seed": 2**64 - 1, "n": 2}, {"seed": 2**63 - 1, "n": 2}, {"seed": -(2**63) - 1}):
        with pytest.raises(InvalidInput, match="`seed`"):  # (choice i samples with seed + i: past 64 bits, a 500 once)
            sampling_fields(body)
