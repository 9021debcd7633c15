"""`inferd serve --model PATH` as a new user runs it: model folders and no config file, a real process
answering real clients; with `--api-key`, as the openai client sends it."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from inferd.backends.small_models import build_cross_encoder  # noqa: E402
from inferd.backends.transformer import default_model_path  # noqa: E402

from ..helpers import PYTHON, ServerProcess, until  # noqa: E402


async def test_model_folders_are_served_with_no_config_file_and_one_key(http, tmp_path):
    reranker = build_cross_encoder(tmp_path / "reranker")  # (config.json: a one-output classifier, so it reranks)
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--model", default_model_path(), "--name", "minilm",
                            "--model", str(reranker), "--port", "0", "--api-key", "s3cret"])
    key = {"Authorization": "Bearer s3cret"}
    try:
        url = await asyncio.to_thread(server.wait_listening)

        async def healthy() -> bool:
            async with http.get(f"{url}/health") as resp:
                return resp.status == 200

        await until(healthy, 120, step_s=0.1)
        async with http.post(f"{url}/v1/embeddings", json={"input": "hello"}) as resp:
            assert resp.status == 401
        async with http.post(f"{url}/v1/embeddings", json={"model": "minilm", "input": ["hello", "world"]},
                             headers=key) as resp:
            body = await resp.json()
            assert resp.status == 200 and [len(d["embedding"]) for d in body["data"]] == [384, 384]
        async with http.post(f"{url}/rerank", json={"query": "batching", "texts": ["a batch", "soup"]}, headers=key) as resp:
            ranked = await resp.json()
            assert resp.status == 200 and sorted(r["index"] for r in ranked) == [0, 1]  # (TEI's body: no model)
        async with http.get(f"{url}/info") as resp:
            assert resp.status == 401  # (--api-key guards what names the models, as vllm serve's guards /v1/models)
        async with http.get(f"{url}/info", headers=key) as resp:
            info = await resp.json()
            assert info["model_id"] == "minilm" and [m["id"] for m in info["models"]] == ["minilm", "reranker"]
            # (TEI's own fields, as its clients and dashboards read them)
            assert info["model_type"] == {"embedding": {"pooling": "mean"}} and info["model_dtype"] == "float32"
            assert info["max_input_length"] == 256 and info["auto_truncate"] is True
        async with http.get(f"{url}/ping") as resp:
            assert resp.status == 200 and (await resp.json())["status"] == "ok"  # (vLLM's probe, open as /health is)
    finally:
        server.stop()


async def test_print_config_writes_the_toml_it_would_serve(tmp_path):
    proc = await asyncio.create_subprocess_exec(PYTHON, "-m", "inferd", "serve", "--model", default_model_path(),
                                                "--task", "embed", "--print-config", stdout=asyncio.subprocess.PIPE)
    out, _ = await proc.communicate()
    assert proc.returncode == 0
    (tmp_path / "made.toml").write_bytes(out)
    check = await asyncio.create_subprocess_exec(PYTHON, "-m", "inferd", "check-config", str(tmp_path / "made.toml"),
                                                 stdout=asyncio.subprocess.PIPE)
    said, _ = await check.communicate()
    assert check.returncode == 0 and b"inferd.backends.transformer:create" in said


def hub_cache(root, repo: str, folder) -> str:  # type: ignore[no-untyped-def]
    """A Hugging Face cache (HF_HUB_CACHE) holding `folder`'s files as `repo`'s snapshot at main, as
    huggingface_hub lays one out after a download: models--ORG--NAME/{refs/main, snapshots/REV/...}."""
    import shutil

    revision = "0123456789abcdef0123456789abcdef01234567"
    entry = root / f"models--{repo.replace('/', '--')}"
    shutil.copytree(folder, entry / "snapshots" / revision)
    (entry / "refs").mkdir()
    (entry / "refs" / "main").write_text(revision)
    return str(root)


async def test_a_hub_id_is_served_from_the_hugging_face_cache_offline(tmp_path):
    """`--model org/name` with no such local folder: the snapshot in the cache (HF_HUB_OFFLINE=1: no
    network asked), named after its name part; one the cache lacks is a one-line error naming the cache."""
    import os

    reranker = build_cross_encoder(tmp_path / "built")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": hub_cache(tmp_path / "hub", "acme/tiny-reranker", reranker)}
    proc = await asyncio.create_subprocess_exec(PYTHON, "-m", "inferd", "serve", "--model", "acme/tiny-reranker",
                                                "--print-config", stdout=asyncio.subprocess.PIPE, env=env, cwd=tmp_path)
    out, _ = await proc.communicate()
    assert proc.returncode == 0, out
    text = out.decode()
    assert 'name = "tiny-reranker"' in text and 'task = "rerank"' in text and "models--acme--tiny-reranker" in text
    missing = await asyncio.create_subprocess_exec(PYTHON, "-m", "inferd", "serve", "--model", "acme/not-cached",
                                                   "--print-config", stdout=asyncio.subprocess.PIPE,
                                                   stderr=asyncio.subprocess.PIPE, env=env, cwd=tmp_path)
    _, err = await missing.communicate()
    assert missing.returncode == 2 and b"HF_HUB_OFFLINE" in err and b"acme/not-cached" in err, err
