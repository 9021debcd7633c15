"""`inferd serve --model PATH`'s config (`model_folders`): a folder's config.json decides the task unless
told, and the TOML printed is the config that runs (read back by the file parser)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from inferd.cli import main
from inferd.config import ConfigError, parse_config
from inferd.config.model_folders import FolderModel, folder_config, folder_config_toml, folder_task


def folder(root: Path, name: str, **config) -> Path:  # type: ignore[no-untyped-def]
    path = root / name
    path.mkdir()
    (path / "config.json").write_text(json.dumps(config))
    return path


@pytest.mark.parametrize(("config", "task"), [
    ({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}, "generate"),
    ({"architectures": ["GPT2LMHeadModel"]}, "generate"),
    ({"architectures": ["BertForSequenceClassification"], "num_labels": 1}, "rerank"),
    ({"architectures": ["BertForSequenceClassification"], "id2label": {"0": "neg", "1": "pos"}}, "classify"),
    ({"architectures": ["ViTModel"], "model_type": "vit"}, "image"),
    ({"architectures": ["BertModel"], "model_type": "bert"}, "embed"),
    ({}, "embed"),
])
def test_the_folders_config_says_what_the_model_does(tmp_path, config, task):
    assert folder_task(folder(tmp_path, "m", **config)) == task


def test_the_printed_toml_is_the_config_that_runs(tmp_path):
    llm = folder(tmp_path, "My Llama 1B", architectures=["LlamaForCausalLM"])
    embedder = folder(tmp_path, "embedder", architectures=["BertModel"])
    config, text = folder_config([FolderModel(str(embedder)), FolderModel(str(llm)),
                                  FolderModel(str(embedder), task="classify", name="sentiment")], port=0,
                                 api_key_sha256="ab" * 32)
    assert parse_config(tomllib.loads(text)) == config
    assert [(m.name, m.kind, m.backend) for m in config.models] == [
        ("embedder", "batch", "inferd.backends.transformer:create"),
        ("My-Llama-1B", "generation", "inferd.backends.vllm"),
        ("sentiment", "batch", "inferd.backends.transformer:create")]
    assert config.models[0].options == {"model_path": str(embedder.resolve()), "task": "embedding"}
    assert config.models[2].options["task"] == "classification" and config.port == 0
    assert config.auth.enabled and config.auth.anonymous_tier is None  # (a key is needed)
    assert [(t.name, t.key_sha256) for t in config.tenants] == [("api-key", "ab" * 32)]
    assert not parse_config(tomllib.loads(folder_config_toml([FolderModel(str(embedder))]))).auth.enabled


def test_mistakes_are_named(tmp_path):
    embedder = folder(tmp_path, "embedder")
    (tmp_path / "empty").mkdir()
    cases = [([FolderModel(str(tmp_path / "missing"))], "no such folder"),
             ([FolderModel(str(tmp_path / "empty"))], "no readable config.json"),
             ([FolderModel(str(embedder), task="summarise")], "--task 'summarise'"),
             ([FolderModel(str(embedder), name="a b")], "--name 'a b'"),
             ([FolderModel(str(embedder)), FolderModel(str(embedder))], "two models named 'embedder'")]
    for models, message in cases:
        with pytest.raises(ConfigError, match=message):
            folder_config(models)


@pytest.mark.parametrize("text", ['[]', '"str"', '{"architectures": 5}', '{"num_labels": "two", "architectures": ["BertForSequenceClassification"]}',
                                  '{"num_labels": null}', '{"id2label": 7}', '{"model_type": ["vit"]}', '{"architectures": [1]}'])
def test_a_config_json_of_the_wrong_shape_is_one_line_and_exit_2(tmp_path, capsys, text):
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(text)
    with pytest.raises(ConfigError) as refused:
        folder_task(path)
    assert "config.json" in str(refused.value) and "\n" not in str(refused.value)
    assert main(["serve", "--model", str(path), "--print-config"]) == 2  # (not a traceback)
    assert "config.json" in capsys.readouterr().err
