"""What a batch model's batches have been: their number, sizes and stage times. Delivery writes it as
each batch is answered and reports read it, both on the event loop."""

from __future__ import annotations

import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from ..messages import Batch
from .histogram import TOKEN_BUCKETS, Histogram


@dataclass
class BatchStats:
    batches: int = 0
    requests_computed: int = 0
    batch_sizes: Counter[int] = field(default_factory=Counter)
    queue_wait: Histogram = field(default_factory=Histogram)  # per request: from entering the queue to its batch's start
    linger: Histogram = field(default_factory=Histogram)  # per batch: how long a free worker waited for it to fill
    compute: Histogram = field(default_factory=Histogram)  # per batch: the backend call
    compute_s_by_size: defaultdict[int, float] = field(default_factory=lambda: defaultdict(float))  # backend time by size
    compute_request_s: float = 0.0  # backend time per request computed, summed (a batch's time once per request in it)
    last_batch_at: float = 0.0  # wall clock (time.time()) of the latest batch answered
    input_tokens: Histogram = field(default_factory=lambda: Histogram(TOKEN_BUCKETS))  # per computed input, where counted

    def record(self, batch: Batch) -> None:
        """A batch was answered (its requests' waits are observed one by one by delivery)."""
        self.batches += 1
        self.requests_computed += batch.size
        self.batch_sizes[batch.size] += 1
        self.compute.observe(batch.compute_s)
        self.compute_s_by_size[batch.size] += batch.compute_s
        self.compute_request_s += batch.compute_s * batch.size
        self.last_batch_at = time.time()
        requests = batch.requests
        if requests and requests[0].tokens:  # (a backend that counts its inputs' tokens: the text models)
            observe = self.input_tokens.observe
            for request in requests:
                observe(request.tokens)
        self.linger.observe(batch.linger_s)

    @property
    def mean_batch_size(self) -> float:
        return round(self.requests_computed / self.batches, 2) if self.batches else 0.0
