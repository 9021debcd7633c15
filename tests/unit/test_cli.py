"""The command line's own decisions (`cli.py`): `--api-key` over a config file, and the arguments that
only make sense with `--model`."""

from __future__ import annotations

import hashlib

from inferd.cli import main, with_api_key
from inferd.config import AuthConfig, ServerConfig, TenantConfig, TierConfig


def test_an_api_key_over_a_config_adds_a_tenant_in_the_highest_tier_and_turns_auth_on():
    digest = hashlib.sha256(b"s3cret").hexdigest()
    config = with_api_key(ServerConfig(), "s3cret")
    assert config.auth.enabled and config.auth.anonymous_tier is None
    assert config.tenants == (TenantConfig("api-key", "default", digest),)
    tiered = ServerConfig(auth=AuthConfig(enabled=True, anonymous_tier="free"),
                          tiers=(TierConfig("paid", priority=1), TierConfig("free")),
                          tenants=(TenantConfig("acme", "free", "ab" * 32),))
    keyed = with_api_key(tiered, "s3cret")
    assert keyed.auth == tiered.auth and [(t.name, t.tier) for t in keyed.tenants] == [("acme", "free"), ("api-key", "paid")]
    assert with_api_key(tiered, None) is tiered


def test_folder_only_arguments_without_a_folder_are_refused(capsys):
    assert main(["serve", "--task", "embed"]) == 2
    assert "go with --model" in capsys.readouterr().err
    assert main(["serve", "--model", "/no/such/folder", "--print-config"]) == 2
    assert "no such folder" in capsys.readouterr().err
