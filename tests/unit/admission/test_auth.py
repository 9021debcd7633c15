"""API keys: looked up by SHA-256 digest, compared in constant time, never kept in plain text."""

from __future__ import annotations

import dataclasses
import hashlib

import pytest

from inferd.admission.auth import Authenticator, presented_key
from inferd.admission.rate_limits import RateLimiter
from inferd.config import AuthConfig, ServerConfig, TenantConfig, TierConfig
from inferd.errors import Forbidden, Unauthorized

KEY, ADMIN = "key-of-acme", "admin-key"


def config(anonymous: str | None, unknown_keys: str = "refuse") -> ServerConfig:
    digest = hashlib.sha256(KEY.encode()).hexdigest()
    return ServerConfig(
        auth=AuthConfig(enabled=True, anonymous_tier=anonymous, admin_key_sha256=hashlib.sha256(ADMIN.encode()).hexdigest(),
                        unknown_keys=unknown_keys),
        tiers=(TierConfig("paid", priority=1), TierConfig("free")),
        tenants=(TenantConfig("acme", "paid", digest),),
    )


def test_keys_from_either_header_and_anonymous_callers():
    auth = Authenticator(config("free"), RateLimiter(config("free")))
    assert auth.identify({"Authorization": f"Bearer {KEY}"}).tenant == "acme"
    assert auth.identify({"X-API-Key": KEY}).tier == "paid"
    assert auth.identify({}).tenant == "anonymous"
    with pytest.raises(Unauthorized):
        auth.identify({"Authorization": "Bearer wrong"})
    assert presented_key({"Authorization": "Basic abc", "X-API-Key": " k "}) == "k"


def test_anonymous_refused_without_an_anonymous_tier_and_admin_needs_the_admin_key():
    auth = Authenticator(config(None), RateLimiter(config(None)))
    with pytest.raises(Unauthorized):
        auth.identify({})
    with pytest.raises(Forbidden):
        auth.require_admin({"Authorization": f"Bearer {KEY}"})
    auth.require_admin({"Authorization": f"Bearer {ADMIN}"})


def test_without_auth_everyone_is_anonymous_and_keys_are_ignored():
    auth = Authenticator(ServerConfig(), RateLimiter(ServerConfig()))
    assert auth.identify({"Authorization": "Bearer anything"}).tenant == "anonymous"


def test_unknown_keys_can_be_served_as_anonymous_for_clients_that_always_send_one():
    """OpenAI's client sends `api_key="unused"` when it has none: with unknown_keys = "anonymous" that is
    the anonymous tier, while a tenant's key still names its tenant."""
    auth = Authenticator(config("free", "anonymous"), RateLimiter(config("free", "anonymous")))
    who = auth.identify({"Authorization": "Bearer unused"})
    assert (who.tenant, who.tier) == ("anonymous", "free")
    assert auth.identify({"Authorization": f"Bearer {KEY}"}).tenant == "acme"
    keyed = config("free", "anonymous")
    keyed = dataclasses.replace(keyed, auth=dataclasses.replace(keyed.auth, operations="key"))
    operations = Authenticator(keyed, RateLimiter(keyed))
    with pytest.raises(Unauthorized):  # (the operations endpoints still want a real key)
        operations.require_operations({"Authorization": "Bearer unused"})
    operations.require_operations({"Authorization": f"Bearer {KEY}"})
