"""A batch model's result cache: outputs of finished computations, bounded by bytes (least recently used
goes first) and by age (a fixed time to live). Opt-in per model (`cache_bytes`).

Keys are the model's input identities (see `shared_work.identity`), scoped by the caller's tenant
unless the model shares its cache: a tenant never learns from a quick answer what another one asked.
Only the event loop touches it, so it holds no lock.
"""

from __future__ import annotations

import sys
from collections import OrderedDict, deque
from collections.abc import Hashable
from typing import Any

import numpy as np
import orjson

MISS = object()  # what `get` returns when there is no fresh entry


# What an entry holds besides its key and output: the table's node, the entry's tuple and time, its
# record in the expiry queue (tracemalloc over 20,000 entries: 160 bytes each).
ENTRY_BYTES = 160

class ResultCache:
    """Outputs by key, at most `max_bytes` of them (keys and outputs counted), each for `ttl_s`."""

    def __init__(self, max_bytes: int, ttl_s: float) -> None:
        self.max_bytes = max_bytes
        self.ttl_s = ttl_s
        self.bytes = 0
        self.hits = self.misses = self.evictions = self.expirations = 0
        self._entries: OrderedDict[Hashable, tuple[Any, int, float]] = OrderedDict()  # output, size, expires_at
        self._expiry: deque[tuple[float, Hashable]] = deque()  # (expires_at, key) in insertion order

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: Hashable, now: float) -> Any:
        """The stored output, or MISS (an expired entry is a miss, and is dropped)."""
        self._expire(now)
        entry = self._entries.get(key)
        if entry is None or entry[2] <= now:
            self.misses += 1
            return MISS
        self._entries.move_to_end(key)
        self.hits += 1
        return entry[0]

    def put(self, key: Hashable, output: Any, now: float) -> None:
        """Store a fresh output; one bigger than the whole cache is not stored."""
        output, size = _owned(output), _size(key) + _size(output) + ENTRY_BYTES
        if size > self.max_bytes:
            return
        old = self._entries.pop(key, None)
        if old is not None:
            self.bytes -= old[1]
        expires_at = now + self.ttl_s
        self._entries[key] = (output, size, expires_at)
        self._expiry.append((expires_at, key))
        self.bytes += size
        while self.bytes > self.max_bytes:
            _, (_, evicted, _) = self._entries.popitem(last=False)
            self.bytes -= evicted
            self.evictions += 1
        self._expire(now)

    def _expire(self, now: float) -> None:
        """Drop the entries past their time (the expiry queue is in time order: the TTL is one for all)."""
        expiry, entries = self._expiry, self._entries
        while expiry and expiry[0][0] <= now:
            expires_at, key = expiry.popleft()
            entry = entries.get(key)
            if entry is not None and entry[2] == expires_at:  # (not replaced by a later put)
                del entries[key]
                self.bytes -= entry[1]
                self.expirations += 1
        if len(expiry) > 2 * len(entries) + 64:  # evicted keys' stale records: compact now and then
            self._expiry = deque((e[2], k) for k, e in sorted(entries.items(), key=lambda item: item[1][2]))


def _owned(output: Any) -> Any:
    """An array that views a whole batch's array would keep all of it alive: store a copy of the row
    (also inside a tuple, as shared work stores (output, bucket, tokens)), so the bytes counted are the
    bytes held."""
    if isinstance(output, np.ndarray) and output.base is not None:
        return output.copy()
    if isinstance(output, tuple):
        return tuple(_owned(item) for item in output)
    return output


def _size(value: Any) -> int:
    """Bytes a value holds, near enough for a bound."""
    if isinstance(value, np.ndarray):
        return value.nbytes + 112
    if isinstance(value, (str, bytes)):
        return sys.getsizeof(value)
    if isinstance(value, tuple):
        return sys.getsizeof(value) + sum(_size(v) for v in value)
    try:
        return len(orjson.dumps(value, option=orjson.OPT_SERIALIZE_NUMPY)) + 64
    except TypeError:
        return sys.getsizeof(value)
