"""The small models' command: each kind made into a folder, `--help` parsed as help (not a folder),
and a LoRA adapter made by peft for the tiny Llama with its base named."""

from __future__ import annotations

import json

import pytest

from inferd.backends.small_models import main

pytest.importorskip("transformers")


def test_help_is_help_not_a_folder(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0 and "lora" in capsys.readouterr().out and not list(tmp_path.iterdir())


def test_a_lora_adapter_needs_its_base_and_is_peft_s_layout(tmp_path, capsys):
    pytest.importorskip("peft")
    with pytest.raises(SystemExit) as exit_:
        main(["lora", str(tmp_path / "adapter")])
    assert exit_.value.code == 2 and "--base" in capsys.readouterr().err
    assert main(["llama", str(tmp_path / "llama")]) == 0
    assert main(["lora", str(tmp_path / "adapter"), "--base", str(tmp_path / "llama"), "--seed", "3"]) == 0
    config = json.loads((tmp_path / "adapter" / "adapter_config.json").read_text())
    assert config["peft_type"] == "LORA" and sorted(config["target_modules"]) == ["q_proj", "v_proj"]
    assert (tmp_path / "adapter" / "adapter_model.safetensors").stat().st_size > 0
