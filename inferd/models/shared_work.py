"""Identical work, computed once: in-flight collapsing and the result cache of one batch model.

Two requests to one model with the same input (as the client sent it, which the backend's `prepare`
turns deterministically into the same prepared input and bucket) are one computation. While one such
request is preparing, queued or running (the *lead*), later ones attach to it as *riders*: they are
never queued, so a batch never holds two copies of one input and a rider adds no compute to the queue
or to the predicted wait. Each rider keeps its own deadline, tier, tenant and request id; the
computation lives until the latest deadline among them, is scheduled for the earliest due, and runs at
the highest tier among them (so it is shed, if ever, as that tier's); who does what when one of them
leaves is the batch model's (`BatchModel.abandon`, `_expire`).

Collapsing is on by default (`collapse`), the result cache off (`cache_bytes`). The cache is scoped per
tenant unless `cache_scope = "shared"`; collapsing spans tenants, since each rider sent the input itself,
unless `collapse_scope = "tenant"`: a request that rides on another is answered sooner and says so
(`collapsed`), which tells its tenant that someone else just asked the same; with tenant scope the
input's identity includes the tenant, so nothing is shared across tenants (and each computes its own).
"""

from __future__ import annotations

import sys
from collections.abc import Hashable
from typing import Any

import orjson
import xxhash

from ..config import ModelConfig
from ..messages import EveryToken, PendingRequest, RequestState
from .result_cache import MISS, ResultCache

_IN_FLIGHT = (RequestState.PREPARING, RequestState.QUEUED, RequestState.TAKEN)
UNKEYED: Any = object()  # an input whose identity was not found yet (None is an identity's "never shared")


class ImageIdentity:
    """An image's identity (its bytes, or its base64 as sent): hashed once with xxh3, compared whole.

    Why not the image itself as the key: Python hashes a str or bytes with SipHash on its first use,
    1.6-2 ms for a 4 MB image, on the event loop, for every image a model with collapsing (the default)
    admits; xxh3 takes 0.2 ms (bytes; base64 lifted from a large body comes as bytes too, where a str
    had to be encoded first, 1.2 ms for 5.5 MB). Equality is still the whole image, so two images are
    one computation only when identical: a hash collision, chance or crafted (xxh3 is not a keyed hash),
    costs a comparison, never another image's answer. A raw image and base64 are two identities even
    where their bytes are alike (`base64` tells them apart): one is decoded, the other read as it is."""

    __slots__ = ("data", "base64", "_hash")

    def __init__(self, data: bytes | str, base64: bool) -> None:
        self.data = data  # (a str's encoded copy is only hashed, not kept; a str and its bytes are then two keys)
        self.base64 = base64
        whole = data if type(data) is bytes else data.encode("utf-8", "surrogatepass")  # type: ignore[union-attr]
        self._hash = xxhash.xxh3_64_intdigest(whole, seed=int(base64))

    def __hash__(self) -> int:
        return self._hash

    def __eq__(self, other: object) -> bool:
        return (type(other) is ImageIdentity and other._hash == self._hash and other.base64 == self.base64
                and other.data == self.data)

    def __sizeof__(self) -> int:  # (what the result cache counts for a key: the image it holds)
        return object.__sizeof__(self) + sys.getsizeof(self.data)


def identity(raw: Any) -> Hashable | None:
    """What makes two inputs one computation: the text itself; a (query, document) pair; an image's
    bytes or base64 (`ImageIdentity`: not a copy, and not Python's hash of megabytes); an `EveryToken`
    input's own, apart from its text's; the canonical JSON of anything else (token ids); None for what
    JSON cannot write (then it is never shared)."""
    kind = type(raw)
    if kind is str:
        return raw
    if kind is tuple:
        return ("pair", *raw)
    if kind is bytes:
        return ImageIdentity(raw, base64=False)
    if kind is dict and len(raw) == 1 and type(raw.get("image")) in (str, bytes):
        return ImageIdentity(raw["image"], base64=True)
    if kind is EveryToken:  # (its tokens' vectors: never the pooled one of the same text)
        inner = identity(raw.item)
        return None if inner is None else ("every token", inner)
    try:
        return orjson.dumps(raw, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return None


class SharedWork:
    """The leads of one model's computations in flight, by input identity, and its result cache."""

    def __init__(self, config: ModelConfig) -> None:
        self.collapse = config.collapse
        self.cache = ResultCache(config.cache_bytes, config.cache_ttl_s) if config.cache_bytes else None
        self._tenant_scoped = config.cache_scope == "tenant"
        self._by_tenant = config.collapse_scope == "tenant"
        self.enabled = self.collapse or self.cache is not None
        self.collapsed = 0  # requests answered by another request's computation
        self.leads: dict[Hashable, PendingRequest] = {}

    def __len__(self) -> int:
        return len(self.leads)

    def find(self, raw: Any, tenant: str, use_cache: bool, now: float,
             key: Any = UNKEYED) -> tuple[Hashable, Any, PendingRequest | None] | None:
        """Work that answers `raw` without computing it: (its key, the cached (output, bucket, tokens) or
        MISS, the lead in flight or None); None when there is none. `key`: `key_of(raw, tenant)`, when
        the caller has it."""
        if not self.enabled:
            return None
        if key is UNKEYED:
            key = self.key_of(raw, tenant)
        if key is None or (not use_cache or self.cache is None) and (not self.collapse or key not in self.leads):
            return None  # (the usual case, decided with one look-up)
        cached = self.cached(key, tenant, now) if use_cache else MISS
        lead = self.lead_for(key) if cached is MISS else None
        return None if cached is MISS and lead is None else (key, cached, lead)

    def key_of(self, raw: Any, tenant: str) -> Hashable | None:
        """The input's identity for sharing (with its tenant, when collapsing is scoped by tenant)."""
        key = raw if type(raw) is str else identity(raw)
        return (tenant, key) if self._by_tenant and key is not None else key

    def cached(self, key: Hashable, tenant: str, now: float) -> Any:
        """A fresh cached (output, bucket, tokens) for this input and tenant, or MISS."""
        if self.cache is None:
            return MISS
        return self.cache.get((tenant, key) if self._tenant_scoped else key, now)

    def lead_for(self, key: Hashable) -> PendingRequest | None:
        """The request whose computation of this input is in flight, if collapsing and there is one."""
        lead = self.leads.get(key) if self.collapse else None
        return lead if lead is not None and lead.state in _IN_FLIGHT else None

    def attach(self, lead: PendingRequest, rider: PendingRequest) -> None:
        riders = lead.riders
        if riders is None:
            lead.riders = [rider]
        else:
            riders.append(rider)
        if rider.deadline > lead.deadline:
            lead.deadline = rider.deadline  # the computation lives as long as someone can use it...
        if rider.due < lead.due:
            lead.due = rider.due  # ...and is scheduled for the most pressing of them
        self.collapsed += 1

    def register_lead(self, request: PendingRequest) -> None:
        """A fresh request is computed: identical inputs arriving meanwhile attach to it (when collapsing,
        and when its input has an identity: see `identity`)."""
        if self.collapse and request.key is not None:
            self.leads[request.key] = request

    def settle(self, lead: PendingRequest) -> None:
        """The lead's computation is over (answered, failed or withdrawn): nobody attaches to it now."""
        if self.leads.get(lead.key) is lead:
            del self.leads[lead.key]

    def remember(self, lead: PendingRequest, output: Any, now: float) -> None:
        """Cache a computed output (with the input's bucket and tokens), for the lead's tenant and each
        rider's (or once, when shared)."""
        cache = self.cache
        if cache is None:
            return
        entry = (output, lead.bucket, lead.tokens)
        if not self._tenant_scoped:
            cache.put(lead.key, entry, now)
            return
        tenants = {lead.tenant, *(r.tenant for r in lead.riders or ())}
        for tenant in tenants:
            cache.put((tenant, lead.key), entry, now)


def waited_for(lead: PendingRequest) -> bool:
    """Whether a client still waits on the lead's computation: its own, or a rider's."""
    if not lead.future.done():
        return True
    return any(not r.future.done() for r in lead.riders or ())
