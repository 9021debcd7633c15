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
            info = await resp.json()
            assert info["model_id"] == "minilm" and [m["id"] for m in info["models"]] == ["minilm", "reranker"]
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
