"""Collapsing inside one batch model, without workers: who waits on which computation, and what a
deadline or a departure does to it."""

from __future__ import annotations

import asyncio
import os
import time

import numpy as np
import pytest

from inferd.config import ModelConfig, TierConfig
from inferd.errors import DeadlineExceeded, InferenceFailed, ServiceOverloaded
from inferd.messages import RequestState
from inferd.models.batch_model import BatchModel
from inferd.models.result_cache import MISS, ResultCache
from inferd.models.shared_work import ImageIdentity, identity
from inferd.observability.metrics import RequestMetrics


def model(tiers: tuple[TierConfig, ...] = (TierConfig("default"),), **kw) -> BatchModel:  # type: ignore[no-untyped-def]
    """A model whose (never started) worker counts as healthy, with 1 ms batches: nothing is refused."""
    config = ModelConfig(name="m", backend="inferd.backends.sim:create", max_wait_ms=0, **kw)
    served = BatchModel(config, asyncio.get_running_loop(), RequestMetrics(), tiers=tiers)
    served.pool.healthy = 1
    served.costs.measured([(0, 1, 0.001)])
    return served


def run_next_batch(served: BatchModel, outputs=None, error=None) -> list[str]:  # type: ignore[no-untyped-def]
    """Take the next batch as a worker would and finish it with `outputs` (default: each input upper-cased);
    returns the inputs it ran. Delivered, the batch let go of its requests (no request/batch cycle)."""
    batch = served.batcher.next_batch((), lambda b: None)
    assert batch is not None
    inputs = [r.input for r in batch.requests]
    batch.started_at = batch.finished_at = time.monotonic()
    batch.outputs = outputs if outputs is not None else [text.upper() for text in inputs]
    batch.error = error
    served.delivery.batch_done(batch)
    assert batch.requests == [] and batch.outputs is None and batch.size == len(inputs)
    return inputs


def test_identity_is_the_text_itself_or_canonical_json():
    assert identity("abc") == "abc" and identity([1, 2]) == identity([1, 2]) != identity("[1,2]")
    assert identity({"b": 1, "a": 2}) == identity({"a": 2, "b": 1}) and identity(object()) is None
    # Pairs and images by kind: never equal to a text, nor to each other's kind.
    assert identity(("q", "d")) == identity(("q", "d")) != identity(("q", "e"))
    assert identity({"image": "aGk="}) == identity({"image": "aGk="}) != identity("aGk=")
    assert identity({"image": "aGk="}) != identity({"image": "aGl="}) != identity(b"aGl=")  # (raw and base64: two)
    assert identity({"image": b"aGl="}) == identity({"image": b"aGl="}) != identity(b"aGl=")  # (lifted base64: bytes)
    assert identity(b"\x89PNG") == identity(bytes(bytearray(b"\x89PNG"))) != identity(("image", "\x89PNG"))


def test_an_image_is_one_key_only_when_identical_whatever_its_hash():
    """Images are hashed with xxh3 (not Python's SipHash of megabytes, on the loop), but compared whole:
    a hash collision costs a comparison, never another image's answer."""
    image = os.urandom(1 << 20)
    leads = {identity(image): "lead"}
    assert leads.get(identity(bytes(bytearray(image)))) == "lead"  # the same image, another object
    other = ImageIdentity(image[:-1] + bytes([image[-1] ^ 1]), base64=False)
    other._hash = hash(identity(image))  # a collision, as if crafted
    assert hash(other) == hash(identity(image)) and leads.get(other) is None


def test_the_result_cache_counts_an_images_bytes_in_its_key():
    key = identity({"image": "A" * (2 << 20)})
    small = ResultCache(max_bytes=1 << 20, ttl_s=60)
    small.put(key, np.zeros(4, dtype=np.float32), now=0.0)
    assert small.bytes == 0 and small.get(key, now=0.0) is MISS  # over the cache by its key alone
    large = ResultCache(max_bytes=8 << 20, ttl_s=60)
    large.put(key, np.zeros(4, dtype=np.float32), now=0.0)
    assert large.bytes >= 2 << 20 and large.get(identity({"image": "A" * (2 << 20)}), now=0.0) is not MISS


async def test_riders_get_the_leads_output_and_a_batch_holds_one_copy():
    served = model()
    lead = served.submit("r0", "same", 5.0)
    riders = [served.from_shared_work(f"r{i}", "same", 5.0, "default", "t") for i in (1, 2)]
    other = served.submit("r3", "other", 5.0)
    assert all(r is not None and r.state is RequestState.ATTACHED and r.lead is lead for r in riders)
    assert run_next_batch(served) == ["same", "other"]
    assert [await r.future for r in (lead, *riders, other)] == ["SAME", "SAME", "SAME", "OTHER"]  # type: ignore[union-attr]
    assert served.from_shared_work("r4", "same", 5.0, "default", "t") is None  # done: nothing left to ride on
    assert len(served.shared) == 0 and served.shared.collapsed == 2


async def test_with_collapsing_scoped_by_tenant_only_a_tenants_own_requests_share():
    served = model(collapse_scope="tenant", cache_bytes=1 << 20)
    lead = served.take("a", ("same",), 5.0, "default", "acme")[0]
    theirs = served.take("b", ("same",), 5.0, "default", "globex")[0]
    mine = served.take("c", ("same",), 5.0, "default", "acme")[0]
    assert theirs.state is RequestState.QUEUED and mine.state is RequestState.ATTACHED and mine.lead is lead
    assert run_next_batch(served) == ["same", "same"]  # each tenant's computation of its own
    assert served.take("d", ("same",), 5.0, "default", "globex")[0].state is RequestState.CACHED  # its own entry


async def test_a_lead_past_its_deadline_answers_504_while_its_computation_waits_for_the_rider():
    served = model()
    lead = served.submit("r0", "same", 0.02)
    rider = served.from_shared_work("r1", "same", 5.0, "default", "t")
    assert rider is not None and lead.deadline == rider.deadline  # the computation lives as long as its riders
    with pytest.raises(DeadlineExceeded):
        await lead.future
    assert lead.state is RequestState.QUEUED and served.batcher.depth == 1
    run_next_batch(served)
    assert await rider.future == "SAME"


async def test_the_last_one_leaving_withdraws_the_computation():
    served = model()
    lead = served.submit("r0", "same", 5.0)
    rider = served.from_shared_work("r1", "same", 0.02, "default", "t")
    served.abandon(lead)
    assert lead.state is RequestState.QUEUED  # the rider still waits
    with pytest.raises(DeadlineExceeded):
        await rider.future  # type: ignore[union-attr]
    assert lead.state is RequestState.EXPIRED and served.batcher.depth == 0 and len(served.shared) == 0
    assert served.metrics.expired[("m", "default", "queued")] == 1


async def test_a_computation_runs_and_is_shed_at_the_highest_tier_waiting_on_it():
    served = model(tiers=(TierConfig("enterprise", priority=2), TierConfig("free")), max_queue=2)
    early = served.submit("f0", "early", 5.0, tier="free")
    shared = served.submit("f1", "shared", 5.0, tier="free")
    rider = served.from_shared_work("e0", "shared", 5.0, "enterprise", "acme")
    assert rider is not None and shared.tier == "enterprise"  # the free request's computation is enterprise's now
    served.submit("e1", "late", 5.0, tier="enterprise")  # the queue is full: room is made...
    with pytest.raises(ServiceOverloaded):
        await early.future  # ...by shedding the free request nobody else waits on, not the shared one
    assert shared.state is RequestState.QUEUED and served.batcher.depth == 2
    assert run_next_batch(served) == ["shared", "late"]  # and it goes first, as enterprise work
    assert await rider.future == await shared.future == "SHARED"
    assert served.batcher.depth_by_tier() == {"enterprise": 0, "free": 0}


async def test_a_failed_input_fails_its_riders_and_only_them():
    served = model()
    lead = served.submit("r0", "poison", 5.0)
    rider = served.from_shared_work("r1", "poison", 5.0, "default", "t")
    fine = served.submit("r2", "fine", 5.0)
    batch = served.batcher.next_batch((), lambda b: None)
    batch.started_at = batch.finished_at = time.monotonic()  # type: ignore[union-attr]
    batch.outputs, batch.error, batch.failures = [None, "FINE"], ValueError("bad input"), {0: ValueError("bad")}  # type: ignore[union-attr]
    served.delivery.batch_done(batch)  # type: ignore[arg-type]
    for request in (lead, rider):
        with pytest.raises(InferenceFailed):
            await request.future  # type: ignore[union-attr]
    assert await fine.future == "FINE" and len(served.shared) == 0


async def test_with_collapsing_off_identical_inputs_are_computed_apart():
    served = model(collapse=False)
    served.submit("r0", "same", 5.0)
    assert served.from_shared_work("r1", "same", 5.0, "default", "t") is None


async def test_an_input_without_an_identity_is_computed_on_its_own_and_never_led():
    served = model()
    first, second = (served.submit(f"r{i}", {1, 2}, 5.0) for i in range(2))  # (a set: JSON cannot write it)
    assert first.key is None and second.key is None and len(served.shared) == 0
    assert served.from_shared_work("r3", {1, 2}, 5.0, "default", "t") is None  # nothing to ride on
    assert run_next_batch(served, outputs=["A", "B"]) == [{1, 2}, {1, 2}]
    assert (await first.future, await second.future) == ("A", "B")
