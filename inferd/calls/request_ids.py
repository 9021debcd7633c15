"""A request's id: the client's X-Request-ID when it is sane, otherwise one of ours."""

from __future__ import annotations

import itertools
import os
import re

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:\-]{1,128}")


class RequestIds:
    """Keeps a client's X-Request-ID when it is sane, otherwise makes a new one, unique per process."""

    def __init__(self) -> None:
        self._prefix = "req_" + os.urandom(4).hex()
        self._counter = itertools.count(1)

    def pick(self, client_value: str | None) -> str:
        if client_value is not None and _REQUEST_ID.fullmatch(client_value):
            return client_value
        return f"{self._prefix}{next(self._counter):x}"
