from __future__ import annotations

import numpy as np

from inferd.models.result_cache import MISS, ResultCache


def test_entries_live_for_their_ttl_and_a_hit_counts():
    cache = ResultCache(max_bytes=10_000, ttl_s=1.0)
    cache.put("a", "out-a", now=0.0)
    assert cache.get("a", now=0.5) == "out-a" and cache.get("b", now=0.5) is MISS
    assert cache.get("a", now=1.0) is MISS  # expired at its time
    assert (cache.hits, cache.misses, cache.expirations, len(cache), cache.bytes) == (1, 2, 1, 0, 0)


def test_the_byte_bound_evicts_the_least_recently_used_first():
    cache = ResultCache(max_bytes=1_500, ttl_s=60.0)
    for i in range(3):
        cache.put(f"k{i}", "x" * 200, now=0.0)
    assert cache.get("k0", now=0.0) == "x" * 200  # k0 is now the most recently used
    cache.put("k3", "x" * 200, now=0.0)  # four of ~410 bytes each (key, value, the entry's own) do not fit
    assert cache.get("k1", now=0.0) is MISS and cache.get("k0", now=0.0) is not MISS
    assert cache.bytes <= 1_500 and cache.evictions == 1
    cache.put("huge", "x" * 5_000, now=0.0)  # bigger than the whole cache: not stored, nothing evicted for it
    assert cache.get("huge", now=0.0) is MISS and cache.evictions == 1


def test_a_row_of_a_batch_array_is_stored_as_its_own_copy():
    batch = np.arange(100 * 384, dtype=np.float32).reshape(100, 384)
    cache = ResultCache(max_bytes=10_000, ttl_s=60.0)
    cache.put("row", batch[7], now=0.0)
    stored = cache.get("row", now=0.0)
    assert stored.base is None and np.array_equal(stored, batch[7])  # the batch's 150 kB are not kept alive
    assert cache.bytes < 2_500  # (the row, its key and the entry's own records)


def test_the_transformers_row_in_shared_works_entry_is_copied_too():
    """Shared work stores (output, bucket, tokens); the transformer backend answers rows of one batch
    array (`list(array)`): the cached row must not keep the whole batch's array alive."""
    rows = list(np.ones((64, 384), dtype=np.float32))  # as the transformer backend returns them
    cache = ResultCache(max_bytes=10_000, ttl_s=60.0)
    cache.put("text", (rows[3], 1, 12), now=0.0)
    output, bucket, tokens = cache.get("text", now=0.0)
    assert output.base is None and (bucket, tokens) == (1, 12)  # its own 1.5 kB, not a view into 98 kB
    assert cache.bytes < 2_500  # (the row, its key and the entry's own records)


def test_a_replaced_entry_keeps_its_own_expiry():
    cache = ResultCache(max_bytes=10_000, ttl_s=1.0)
    cache.put("a", "old", now=0.0)
    cache.put("a", "new", now=0.8)
    assert cache.get("a", now=1.2) == "new" and cache.get("a", now=1.8) is MISS


def test_what_the_cache_counts_is_what_its_entries_hold():
    """Measured with tracemalloc: small text entries (the seed's) and transformer rows, within 10%."""
    import gc
    import tracemalloc

    from inferd.backends.sim import expected_output

    rows = list(np.random.rand(32, 384).astype(np.float32))
    for make in (lambda i: expected_output(f"text {i} " + "y" * 100), lambda i: rows[i % 32]):
        cache = ResultCache(max_bytes=1 << 40, ttl_s=60.0)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for i in range(5_000):
            cache.put(f"text {i} " + "y" * 100, (make(i), 0, 7), now=0.0)
        held = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        assert 0.9 < held / cache.bytes < 1.1, held / cache.bytes
