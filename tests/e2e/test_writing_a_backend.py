"""The docs' "Writing a backend" (docs/configuration.md), run as written: its Python files saved where the server imports
them, its TOML tables served, and the answers checked against what the code says."""

from __future__ import annotations

import re
import sys
import tomllib
from dataclasses import replace

import pytest

from inferd.config.parsing import parse_config

from ..helpers import REPO, infer, running_server, until


def readme_blocks() -> tuple[dict[str, str], str]:
    """The section's Python files (by the name in their first comment) and its TOML tables, joined."""
    page = (REPO / "docs" / "configuration.md").read_text()
    section = page.split("<!-- writing-a-backend -->")[1].split("<!-- /writing-a-backend -->")[0]
    files = {re.match(r"# (\w+\.py)", code).group(1): code for code in re.findall(r"```python\n(.*?)```", section, re.S)}
    return files, "\n".join(re.findall(r"```toml\n(.*?)```", section, re.S))


@pytest.fixture
def backend_files(tmp_path, monkeypatch):  # type: ignore[no-untyped-def]
    files, toml = readme_blocks()
    for name, code in files.items():
        (tmp_path / name).write_text(code)
    monkeypatch.syspath_prepend(str(tmp_path))
    yield toml
    for module in ("upper", "bagofwords"):
        sys.modules.pop(module, None)


async def test_the_readmes_two_backends_serve_as_written(http, backend_files):
    config = parse_config(tomllib.loads(backend_files))
    assert [m.name for m in config.models] == ["upper", "bagofwords"]
    models = tuple(replace(m, warmup_inputs=("warm up",)) for m in config.models)
    async with running_server(*models) as srv:
        status, body, _ = await infer(http, srv.url, {"input": "hello batching", "model": "upper"})
        async with http.post(f"{srv.url}/v1/embeddings", json={"input": ["a few words", "more"], "model": "bagofwords"}) as resp:
            vectors = await resp.json()
        async with http.get(f"{srv.url}/v1/models/bagofwords") as resp:
            described = await resp.json()
        bad_status, bad, _ = await infer(http, srv.url, {"input": "   ", "model": "bagofwords"})
    assert (status, body["output"]) == (200, "HELLO BATCHING")
    assert [len(item["embedding"]) for item in vectors["data"]] == [16, 16] and vectors["usage"]["prompt_tokens"] == 4
    assert described["workers"] == 2 and set(described["cost_model"]["buckets"]) == {"0", "1"}  # both buckets timed
    assert (bad_status, bad["error"]) == (400, "INVALID_INPUT") and "empty input" in bad["message"]


async def test_a_hook_that_breaks_the_contract_fails_the_start_by_name(http, tmp_path, monkeypatch):
    (tmp_path / "broken.py").write_text("class Broken:\n    prepare_batch = 5\n    def __call__(self, inputs):\n"
                                        "        return inputs\n\n\nshout = Broken()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    config = parse_config({"models": [{"name": "b", "backend": "broken:shout"}]})
    async with running_server(*config.models, wait_ready=False) as srv:
        await until(lambda: srv.models["b"].start_error is not None)
        assert "`prepare_batch` must be a method" in str(srv.models["b"].start_error)
    sys.modules.pop("broken", None)
