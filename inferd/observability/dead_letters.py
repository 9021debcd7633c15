"""The dead-letter log: the inputs isolated as poison (a batch's bisection found they fail on their own),
kept as a hash and a length, never the input itself; bounded. Shown at `GET /v1/dead-letters`.
"""

from __future__ import annotations

import hashlib
import time
from collections import deque
from typing import Any

from ..errors import describe
from ..messages import PendingRequest


class DeadLetters:
    """The inputs isolated as poison: bounded, and holding a hash and length rather than the input itself."""

    def __init__(self, capacity: int = 1000) -> None:
        self._entries: deque[dict[str, Any]] = deque(maxlen=capacity)
        self.total = 0

    def add(self, request: PendingRequest, model: str, error: BaseException) -> None:
        text = request.raw if request.raw is not None else request.input
        text = text if isinstance(text, str) else repr(text)
        self.total += 1
        self._entries.append(
            {
                "request_id": request.request_id,
                "model": model,
                "input_sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(),
                "input_length": len(text),
                "error": describe(error, 500),
                "at": time.time(),
            }
        )

    def entries(self) -> list[dict[str, Any]]:
        return list(self._entries)
