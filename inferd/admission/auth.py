"""API keys: who is calling. Keys are stored only as SHA-256 hex digests and never logged.

A presented key (`Authorization: Bearer KEY` or `X-API-Key: KEY`) is hashed and the digest looked up,
then compared with `hmac.compare_digest`; the key itself is never compared or kept.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping

from ..config import ServerConfig
from ..errors import Forbidden, Unauthorized
from .rate_limits import Identity, RateLimiter


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
    """Turns the key a request presents into its identity: a tenant and its tier."""

    def __init__(self, config: ServerConfig, limiter: RateLimiter) -> None:
        self.config = config.auth
        self._by_digest: dict[str, tuple[str, Identity]] = {
            t.key_sha256: (t.key_sha256, limiter.identity(t.name, t.tier, t.rate_per_s, t.burst)) for t in config.tenants
        }
        if not self.config.enabled:
            lowest = config.tiers[-1].name
            self._anonymous: Identity | None = limiter.identity("anonymous", lowest)
        elif self.config.anonymous_tier is not None:
            self._anonymous = limiter.identity("anonymous", self.config.anonymous_tier)
        else:
            self._anonymous = None

    def identify(self, headers: Mapping[str, str]) -> Identity:
        """The caller's tenant and tier; raises Unauthorized for a wrong key, or a missing one when
        anonymous requests are refused. Without [auth], everyone is anonymous and keys are ignored."""
        anonymous = self._anonymous  # (always there without [auth])
        if anonymous is not None and not self.config.enabled:
            return anonymous
        key = presented_key(headers)
        if key is None:
            if anonymous is None:
                raise Unauthorized("an API key is required (Authorization: Bearer KEY or X-API-Key)")
            return anonymous
        who = self._tenant(key)
        if who is None:
            if anonymous is not None and self.config.unknown_keys == "anonymous":
                return anonymous  # (`api_key="unused"`, as an OpenAI client must send something)
            raise Unauthorized("unknown API key")
        return who

    def _tenant(self, key: str) -> Identity | None:
        """The tenant whose key this is, if any: looked up by digest (which reveals nothing usable about
        the key), then compared in constant time."""
        digest = key_digest(key)
        stored, who = self._by_digest.get(digest, ("", None))
        return who if who is not None and hmac.compare_digest(digest, stored) else None

    def require_operations(self, headers: Mapping[str, str]) -> None:
        """The operations endpoints (metrics, stats, the model list), as `[auth] operations` says."""
        mode = self.config.operations
        if mode == "admin":
            self.require_admin(headers)
        elif mode == "key":
            key = presented_key(headers)
            if key is None:
                raise Unauthorized("this endpoint needs an API key (Authorization: Bearer KEY)")
            admin = self.config.admin_key_sha256
            if (admin is None or not hmac.compare_digest(key_digest(key), admin)) and self._tenant(key) is None:
                raise Unauthorized("unknown API key")  # (a tenant's key, even where unknown keys are served as anonymous)

    def require_admin(self, headers: Mapping[str, str]) -> None:
        """Admin endpoints: the admin key, and nothing else, opens them."""
        expected = self.config.admin_key_sha256
        key = presented_key(headers)
        if key is None:
            raise Unauthorized("this endpoint needs the admin key (Authorization: Bearer KEY)")
        if expected is None or not hmac.compare_digest(key_digest(key), expected):
            raise Forbidden("this key may not use admin endpoints")

