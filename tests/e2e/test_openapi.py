"""The OpenAPI document is the server's contract: its paths are the routes, and schemathesis sends it
generated requests against a live server (its own process) and checks each answer against it."""

from __future__ import annotations

import asyncio
import subprocess
from pathlib import Path
from xml.etree import ElementTree

import pytest

from inferd.http.api_page import PAGE_FILES
from inferd.openapi.document import PARAMETRISED, PATHS, openapi_document

from ..helpers import PYTHON, ServerProcess, running_server, sim_model, until, write_config

FUZZED_SERVER = """
[server]
max_body_bytes = 65536

[[models]]
name = "m"
backend = "inferd.backends.sim:create"
max_batch_size = 32
max_wait_ms = 1
max_input_chars = 2000
timeout_ms = 2000
[models.options]
latency_ms = 2
max_batch_size = 32
"""
CHECKS = ("not_a_server_error", "status_code_conformance", "content_type_conformance", "response_schema_conformance",
          "negative_data_rejection", "unsupported_method")


def schemathesis_command(url: str, workdir: Path, max_examples: int, *extra: str) -> list[str]:
    """schemathesis' own command against a live server, its JUnit report at workdir/junit.xml."""
    config = workdir / "schemathesis.toml"
    # 503 (the deadline cannot be met, overloaded) and 504 are answers the document promises; a 500 is a bug.
    config.write_text('[checks.not_a_server_error]\nexpected-statuses = ["1xx", "2xx", "3xx", "4xx", "503", "504"]\n')
    return [str(Path(PYTHON).with_name("schemathesis")), "--config-file", str(config), "run", f"{url}/openapi.json",
            "--checks", ",".join(CHECKS), "--max-examples", str(max_examples), "--seed", "7", "--request-timeout", "30",
            "--report", "junit", "--report-junit-path", str(workdir / "junit.xml"), "--no-color", "--generation-database", "none", *extra]


async def test_the_served_document_lists_exactly_the_routes(http):
    async with running_server(sim_model(latency_ms=5)) as srv:
        async with http.get(f"{srv.url}/openapi.json") as resp:
            document = await resp.json()
        routes = set(srv.api.routes) - set(PAGE_FILES)  # (the /docs page's own files are not the API)
    assert document["openapi"] == "3.1.0"
    # (No generation model here: no /v1/completions. The paths with a parameter, and the Open Inference
    # Protocol's, are answered by a prefix rather than the route table.)
    assert set(document["paths"]) == routes | PARAMETRISED
    assert set(PATHS) - routes == {"/v1/completions", "/v1/chat/completions"} | PARAMETRISED
    assert {"/v1/models/{model}", "/v2/models/{model}/infer", "/v2/health/ready"} <= PARAMETRISED


def test_a_server_with_a_generation_model_documents_the_openai_text_endpoints():
    routes = [*PATHS]
    assert set(openapi_document(routes, "x")["paths"]) == set(PATHS)


@pytest.fixture(scope="module")
def live_url(tmp_path_factory):
    config = write_config(tmp_path_factory.mktemp("openapi") / "fuzz.toml", FUZZED_SERVER)
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--config", str(config), "--port", "0"])
    try:
        url = server.wait_listening()
        asyncio.run(_ready(url))
        yield url
    finally:
        server.stop()
    assert not any("Traceback" in line for line in server.lines), "".join(server.lines)


async def _ready(url: str) -> None:
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async def ready() -> bool:
            async with session.get(f"{url}/readyz") as resp:
                return resp.status == 200

        await until(ready, timeout_s=30, step_s=0.05)


def test_schemathesis_finds_no_500_and_no_answer_outside_the_document(live_url, tmp_path):
    """schemathesis' own command against the live server: every operation, a few hundred examples at
    most each (its examples, coverage and fuzzing phases), every answer checked."""
    report = tmp_path / "junit.xml"
    run = subprocess.run(schemathesis_command(live_url, tmp_path, max_examples=150), capture_output=True, text=True,
                         timeout=600, cwd=tmp_path)  # (its crash cache goes in the working directory)
    assert run.returncode == 0, run.stdout[-6000:] + run.stderr[-2000:]
    tested = {case.get("name") for case in ElementTree.parse(report).getroot().iter("testcase")}
    documented = {f"{method.upper()} {path}" for path, item in PATHS.items() for method in item}
    # Every operation this server has (schemathesis leaves out the document it was given; it is read above).
    tested.discard("Stateful tests")  # (its phase that follows links, e.g. from the model list to one model)
    assert tested == documented - {"POST /v1/completions", "POST /v1/chat/completions", "GET /openapi.json"}
