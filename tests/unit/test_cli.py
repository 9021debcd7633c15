"""The command line's own decisions (`cli.py`): `--api-key` over a config file, and the arguments that
only make sense with `--model`."""

from __future__ import annotations

import dataclasses
import hashlib

from inferd.cli import given_key, main, with_keys
from inferd.config import AuthConfig, ServerConfig, TenantConfig, TierConfig


def test_an_api_key_over_a_config_adds_a_tenant_in_the_highest_tier_and_turns_auth_on():
    digest = hashlib.sha256(b"s3cret").hexdigest()
    config = with_keys(ServerConfig(), "s3cret")
    assert config.auth.enabled and config.auth.anonymous_tier is None
    assert config.auth.operations == "key"  # (as `vllm serve --api-key` guards /v1/models: the model list needs it too)
    assert config.tenants == (TenantConfig("api-key", "default", digest),)
    tiered = ServerConfig(auth=AuthConfig(enabled=True, anonymous_tier="free"),
                          tiers=(TierConfig("paid", priority=1), TierConfig("free")),
                          tenants=(TenantConfig("acme", "free", "ab" * 32),))
    keyed = with_keys(tiered, "s3cret")
    assert keyed.auth == dataclasses.replace(tiered.auth, operations="key")
    assert [(t.name, t.tier) for t in keyed.tenants] == [("acme", "free"), ("api-key", "paid")]
    admin_only = dataclasses.replace(tiered, auth=dataclasses.replace(tiered.auth, operations="admin"))
    assert with_keys(admin_only, "s3cret").auth.operations == "admin"  # (the file's own rule, where it set one)
    assert with_keys(tiered, None) is tiered


def test_folder_only_arguments_without_a_folder_are_refused(capsys):
    assert main(["serve", "--task", "embed"]) == 2
    assert "go with --model" in capsys.readouterr().err
    assert main(["serve", "--model", "/no/such/folder", "--print-config"]) == 2
    assert "no such folder" in capsys.readouterr().err


def test_an_admin_key_over_a_config_replaces_the_files_and_leaves_the_rest():
    digest = hashlib.sha256(b"root").hexdigest()
    config = with_keys(ServerConfig(auth=AuthConfig(admin_key_sha256="ab" * 32)), None, "root")
    assert config.auth.admin_key_sha256 == digest and not config.auth.enabled and not config.tenants


def test_folders_with_an_admin_key_serve_keyless_requests_and_open_the_admin_api_to_that_key(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"architectures": ["BertModel"]}')
    assert main(["serve", "--model", str(tmp_path / "m"), "--admin-key", "root", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert 'anonymous_tier = "default"' in text and hashlib.sha256(b"root").hexdigest() in text
    assert main(["serve", "--model", str(tmp_path / "m"), "--admin-key", "root", "--api-key", "k", "--print-config"]) == 0
    both = capsys.readouterr().out
    assert "anonymous_tier" not in both and 'name = "api-key"' in both and hashlib.sha256(b"root").hexdigest() in both


def test_the_printed_config_of_folders_holds_the_grpc_port_asked(capsys, tmp_path):
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"architectures": ["BertModel"]}')
    assert main(["serve", "--model", str(tmp_path / "m"), "--grpc-port", "8001", "--print-config"]) == 0
    text = capsys.readouterr().out
    assert "grpc_port = 8001" in text.split("[[models]]")[0]  # (under [server], as a --config file has it)
    assert main(["serve", "--model", str(tmp_path / "m"), "--print-config"]) == 0
    assert "grpc_port" not in capsys.readouterr().out


def test_an_empty_key_refuses_to_start_and_a_key_is_taken_as_clients_present_it(monkeypatch, capsys):
    monkeypatch.delenv("INFERD_API_KEY", raising=False)
    for empty in ("", "  ", "\n"):  # (`--api-key "$KEY"` with KEY unset: not a server open to anyone)
        assert main(["serve", "--api-key", empty, "--port", "0"]) == 2
        assert "--api-key is empty" in capsys.readouterr().err
    monkeypatch.setenv("INFERD_ADMIN_KEY", "")
    assert main(["serve", "--port", "0"]) == 2
    assert "INFERD_ADMIN_KEY is empty" in capsys.readouterr().err
    assert given_key("k\n", "--api-key", "INFERD_API_KEY") == "k"  # (clients' keys are stripped: so is the operator's)
    monkeypatch.setenv("INFERD_API_KEY", " from-env ")
    assert given_key(None, "--api-key", "INFERD_API_KEY") == "from-env"
    monkeypatch.delenv("INFERD_API_KEY")
    assert given_key(None, "--api-key", "INFERD_API_KEY") is None
