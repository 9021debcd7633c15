"""API keys: who is calling. Keys are stored only as SHA-256 hex digests and never logged.

A presented key (`Authorization: Bearer KEY` or `X-API-Key: KEY`) is hashed and the digest looked up,
then compared with `hmac.compare_digest`; the key itself is never compared or kept.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from .config import AuthConfig
from .errors import Forbidden, Unauthorized


def key_digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def presented_key(headers: Mapping[str, str]) -> str | None:
    auth = headers.get("Authorization")
    if auth is not None:
        scheme, _, token = auth.partition(" ")
        if scheme.lower() == "bearer" and token.strip():
            return token.strip()
    key = headers.get("X-API-Key")
    return key.strip() if key and key.strip() else None


class Authenticator:
    def __init__(self, config: AuthConfig) -> None:
        self.config = config

    def require_admin(self, headers: Mapping[str, str]) -> None:
        """Admin endpoints: the admin key, and nothing else, opens them."""
        expected = self.config.admin_key_sha256
        key = presented_key(headers)
        if key is None:
            raise Unauthorized("this endpoint needs the admin key (Authorization: Bearer KEY)")
        if expected is None or not hmac.compare_digest(key_digest(key), expected):
            raise Forbidden("this key may not use admin endpoints")
