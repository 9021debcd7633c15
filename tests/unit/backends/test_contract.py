"""The backend contract: what a built backend offers is read once, and a hook that breaks the contract
fails the build with its name instead of being skipped."""

from __future__ import annotations

import pytest

from inferd.backends import Prepared
from inferd.backends.contract import BatchBackend, Capabilities, module_memory_bytes
from inferd.backends.sim import create as create_sim


def shout(inputs: list[str]) -> list[str]:
    return [text.upper() for text in inputs]


class Tokenised:
    output_kind = "embedding"
    compatibility = {"dtype": "float32"}

    def __call__(self, batch: list[list[int]]) -> list[list[float]]:
        return [[float(len(ids))] for ids in batch]

    def prepare_batch(self, texts: list[str]) -> list[Prepared]:
        return [Prepared(text.split(), 0, len(text.split())) for text in texts]

    def close(self) -> None:
        pass


def test_a_plain_function_is_a_backend_that_offers_nothing_more():
    offers = Capabilities.of(shout)
    assert isinstance(shout, BatchBackend)
    assert offers == Capabilities()  # no hook, no kind, an empty batch key


def test_a_class_offers_its_hooks_bound_and_its_kind():
    backend = Tokenised()
    offers = Capabilities.of(backend)
    assert offers.prepare_batch is not None and offers.prepare_batch(["a b"])[0].tokens == 2
    assert offers.close is not None and offers.prepare is None and offers.cost is None
    assert (offers.output_kind, dict(offers.compatibility)) == ("embedding", {"dtype": "float32"})
    assert offers.prepare_threads == 1 and offers.prepare_nice == offers.execute_nice == 0  # (unless it asks for more)
    assert offers.buckets_by_length is False
    backend.prepare_threads, backend.buckets_by_length = 4, True
    assert Capabilities.of(backend).prepare_threads == 4 and Capabilities.of(backend).buckets_by_length


@pytest.mark.parametrize(("attribute", "value", "named"), [
    ("prepare_batch", "not a method", "`prepare_batch` must be a method"),
    ("warmup", 3, "`warmup` must be a method"),
    ("output_kind", 1, "`output_kind` must be a string"),
    ("compatibility", ["dtype"], "`compatibility` must be a dict"),
    ("input_kind", "video", "`input_kind` must be one of text, image, pair"),
    ("prepare_threads", 0, "`prepare_threads` must be a positive integer"),
    ("prepare_threads", 2.0, "`prepare_threads` must be a positive integer"),
    ("prepare_nice", -1, "`prepare_nice` must be a non-negative integer"),
    ("execute_nice", 1.5, "`execute_nice` must be a non-negative integer"),
    ("buckets_by_length", 1, "`buckets_by_length` must be True or False"),
    ("embedding_sizes", 0, "`embedding_sizes` must be a positive integer or a list of them"),
    ("embedding_sizes", [64, "128"], "`embedding_sizes` must be a positive integer or a list of them"),
    ("normalized", "yes", "`normalized` must be True or False"),
])
def test_a_hook_that_breaks_the_contract_is_refused_by_name(attribute, value, named):
    backend = Tokenised()
    setattr(backend, attribute, value)
    with pytest.raises(TypeError, match=named):
        Capabilities.of(backend)


def test_something_that_cannot_be_called_is_not_a_backend():
    with pytest.raises(TypeError, match="must be callable"):
        Capabilities.of(object())


def test_the_bucketed_sim_offers_prepare_and_its_module_estimates_its_memory():
    offers = Capabilities.of(create_sim("cpu", {"latency_ms": 1, "bucket_chars": [50]}))
    assert offers.prepare is not None and offers.prepare("x" * 60)[1] == 1  # bound: the second bucket
    assert offers.prepare_batch is None
    assert module_memory_bytes("inferd.backends.sim:create", {"memory_mb": 3}) == 3 << 20
    assert module_memory_bytes("tests.unit.backends.test_contract:shout", {}) == 0  # no estimate: 0


def test_the_hooks_are_read_from_their_protocols_and_written_once_everywhere_else():
    """One place to add a hook (a protocol in `hooks`): `Capabilities` has a field for each, and the
    contract's table in its docstring names each."""
    import dataclasses

    from inferd.backends import contract
    from inferd.backends.hooks import HOOKS

    assert HOOKS[:3] == ("prepare_batch", "prepare", "check_call") and "launch" in HOOKS and "text_of" in HOOKS
    fields = [f.name for f in dataclasses.fields(Capabilities)]
    assert fields[:len(HOOKS)] == list(HOOKS)  # (the bound hooks first, then what is not a hook)
    table = [line for line in (contract.__doc__ or "").splitlines() if line.startswith("| `")]
    assert all(any(f"`{hook}(" in line for line in table) for hook in HOOKS), HOOKS


def test_an_engine_is_checked_for_every_member_its_protocol_declares(monkeypatch):
    from inferd.backends import build_engine, echo_engine

    engine = build_engine("inferd.backends.echo_engine", {})
    assert engine.default_max_tokens > 0

    def create(options, adapters=0):  # an engine without one of the protocol's members
        made = echo_engine.EchoEngine(options, adapters)
        del made.default_max_tokens
        return made

    monkeypatch.setattr(echo_engine, "create", create)
    with pytest.raises(TypeError, match="lacks default_max_tokens"):
        build_engine("inferd.backends.echo_engine", {})
