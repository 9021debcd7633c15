"""What a worker asks of a backend call: the output-length check and the bisection that isolates poison inputs."""

from __future__ import annotations

import pytest

from inferd.execution.backend_calls import OutputMismatch, check_outputs, isolate


class Poisoned(ValueError):
    pass


def model_failing_on(poison: set[str], calls: list[list[str]]):  # type: ignore[no-untyped-def]
    def call(inputs: list[str]) -> list[str]:
        calls.append(list(inputs))
        if poison & set(inputs):
            raise Poisoned(f"poison in {inputs}")
        return [x.upper() for x in inputs]

    return call


def test_outputs_must_be_a_list_of_one_per_input():
    assert check_outputs(("a", "b"), 2) == ["a", "b"]
    with pytest.raises(OutputMismatch, match="1 outputs for 2"):
        check_outputs(["a"], 2)
    with pytest.raises(OutputMismatch, match="str"):
        check_outputs("ab", 2)


def test_bisection_fails_the_poison_input_alone_and_answers_the_rest():
    inputs = [f"x{i}" for i in range(8)]
    calls: list[list[str]] = []
    outputs: list[str | None] = [None] * 8
    failures = isolate(model_failing_on({"x5"}, calls), inputs, Poisoned("whole batch"), outputs, budget=32)
    assert set(failures) == {5} and isinstance(failures[5], Poisoned)
    assert outputs == ["X0", "X1", "X2", "X3", "X4", None, "X6", "X7"]
    assert len(calls) == 6  # halves, then quarters, then pairs of the poisoned side: log2(8) * 2


def test_a_spent_budget_fails_what_is_left_but_keeps_whole_clean_halves():
    inputs = [f"x{i}" for i in range(8)]
    outputs: list[str | None] = [None] * 8
    failures = isolate(model_failing_on({"x1", "x6"}, []), inputs, Poisoned("batch"), outputs, budget=2)
    assert set(failures) == set(range(8))  # both halves hold poison, no budget to split further
    outputs = [None] * 8
    failures = isolate(model_failing_on({"x1"}, []), inputs, Poisoned("batch"), outputs, budget=2)
    assert set(failures) == {0, 1, 2, 3} and outputs[4:] == ["X4", "X5", "X6", "X7"]


def test_giving_up_stops_the_bisection():
    outputs: list[str | None] = [None] * 4
    failures = isolate(model_failing_on({"x0"}, []), ["x0", "x1", "x2", "x3"], Poisoned("b"), outputs, budget=32,
                       give_up=lambda: True)
    assert set(failures) == {0, 1, 2, 3} and outputs == [None] * 4
