"""Signals and the README's commands, against `inferd serve` running as its own process."""

from __future__ import annotations

import asyncio
import re
import shutil
import signal

import pytest

from inferd.backends.sim import expected_output

from ..helpers import PYTHON, REPO, ServerProcess, infer, until, write_config

SLOW_MODEL = """
[server]
grace_period_s = 10

[[models]]
name = "slow"
backend = "inferd.backends.sim:create"
max_batch_size = 5
max_wait_ms = 0
[models.options]
latency_ms = 300
max_batch_size = 5
"""


async def test_sigterm_drains_without_losing_an_admitted_request(http, tmp_path):
    config = write_config(tmp_path / "slow.toml", SLOW_MODEL)
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--config", str(config), "--port", "0"])
    try:
        url = await asyncio.to_thread(server.wait_listening)
        await _wait_ready(http, url)
        admitted = [asyncio.create_task(infer(http, url, {"input": f"t{i}"})) for i in range(20)]
        await _wait_for(http, f"{url}/v1/stats", lambda stats: stats["process"]["in_flight"] == 20)  # 4 batches: ~1.2 s
        server.signal(signal.SIGTERM)
        await _wait_for(http, f"{url}/readyz", lambda ready: not ready["ready"])
        status, body, headers = await infer(http, url, {"input": "after-sigterm"})
        assert (status, body["error"]) == (503, "DRAINING")
        assert body["retry_after_ms"] > 0 and headers["Connection"].lower() == "close"
        results = await asyncio.gather(*admitted)
        for i, (status, body, _) in enumerate(results):
            assert status == 200, body
            assert body["output"] == expected_output(f"t{i}")
        assert await asyncio.to_thread(server.proc.wait, 15) == 0
    finally:
        server.stop()


async def test_a_slow_body_to_a_route_outside_the_count_does_not_let_the_drain_skip_an_admitted_request(http, tmp_path):
    """A request computing (in flight 1) and another client sending one byte of a 20-byte body to
    POST /v2/repository/index (a route the lifecycle does not count): reading that body once stepped a
    request out of the count that it had never entered, the count fell to 0, and SIGTERM's drain did not
    wait: the computing request got 503 DRAINING instead of its answer."""
    config = write_config(tmp_path / "slow.toml", SLOW_MODEL.replace("latency_ms = 300", "latency_ms = 1500"))
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--config", str(config), "--port", "0"])
    try:
        url = await asyncio.to_thread(server.wait_listening)
        await _wait_ready(http, url)
        computing = asyncio.create_task(infer(http, url, {"input": "computing"}))
        await _wait_for(http, f"{url}/v1/stats", lambda stats: stats["process"]["in_flight"] == 1)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        _, writer = await asyncio.open_connection(host, int(port))
        writer.write(b"POST /v2/repository/index HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                     b"Content-Length: 20\r\n\r\n{")  # (one byte of twenty: the rest never comes)
        await writer.drain()
        await asyncio.sleep(0.3)
        async with http.get(f"{url}/v1/stats") as resp:
            assert (await resp.json())["process"]["in_flight"] == 1  # (0 before the fix)
        server.signal(signal.SIGTERM)
        status, body, _ = await computing
        assert status == 200 and body["output"] == expected_output("computing"), body
        writer.close()
        assert await asyncio.to_thread(server.proc.wait, 15) == 0
    finally:
        server.stop()


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
async def test_the_readme_run_command_serves_the_default_config(http):
    """`make run` (with the port moved off 8000 so it cannot clash) answers an inference request."""
    server = ServerProcess(["make", "--no-print-directory", "run", "ARGS=--port 0"], cwd=REPO)
    try:
        url = await asyncio.to_thread(server.wait_listening, 300)
        await _wait_ready(http, url)
        status, body, _ = await infer(http, url, {"input": "E equals "})
        assert status == 200 and body["model"] == "batchstring"
        assert body["output"] == expected_output("E equals ")
    finally:
        server.stop(whole_group=True)  # make and the server it started
    assert any("inferd.server: stopped" in line for line in server.lines), "".join(server.lines)


async def _wait_for(http, url: str, condition, timeout_s: float = 30) -> None:  # type: ignore[no-untyped-def]
    """Until a JSON endpoint of a server in another process shows `condition(body)`."""
    async def shows() -> bool:
        async with http.get(url) as resp:
            return condition(await resp.json())

    await until(shows, timeout_s, step_s=0.005)


async def _wait_ready(http, url: str, timeout_s: float = 120) -> None:  # type: ignore[no-untyped-def]
    async def ready() -> bool:
        async with http.get(f"{url}/readyz") as resp:
            return resp.status == 200

    await until(ready, timeout_s, step_s=0.05)


BROKEN_MODELS = {
    "a backend that does not import": 'backend = "inferd.backends.no_such_backend:create"',
    "a factory that raises": 'backend = "inferd.backends.transformer:create"\n[models.options]\ntask = "embeddings"',
    "a misspelt backend option": 'backend = "inferd.backends.sim:create"\n[models.options]\nlatency = 10',
    "a generation model without model_path": 'backend = "inferd.backends.vllm"\nkind = "generation"',
}


@pytest.mark.parametrize("broken", BROKEN_MODELS.values(), ids=BROKEN_MODELS.keys())
async def test_a_model_that_cannot_be_built_at_start_up_stops_the_process_with_one_line(tmp_path, broken):
    config = write_config(tmp_path / "broken.toml", f'[[models]]\nname = "m"\n{broken}\n')
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--config", str(config), "--port", "0"])
    try:
        code = await asyncio.to_thread(server.proc.wait, 60)
    finally:
        server.stop()
    output = "".join(server.lines)
    assert code == 1, output
    assert "Traceback" not in output, output
    fatal = [line for line in server.lines if line.startswith("inferd: ")]
    assert len(fatal) == 1 and "model m failed to start" in fatal[0], output


async def test_a_port_in_use_is_one_line_and_exit_1(tmp_path):
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--port", str(port)])
        try:
            code = await asyncio.to_thread(server.proc.wait, 60)
        finally:
            server.stop()
    output = "".join(server.lines)
    assert code == 1 and "Traceback" not in output, output
    assert any(line.startswith("inferd: cannot listen on") and str(port) in line for line in server.lines), output


async def test_sighup_with_an_unchanged_config_changes_nothing_and_ready_is_said_once(http, tmp_path):
    config = write_config(tmp_path / "slow.toml", SLOW_MODEL)
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--config", str(config), "--port", "0"])
    try:
        url = await asyncio.to_thread(server.wait_listening)
        await _wait_ready(http, url)
        server.signal(signal.SIGHUP)
        await until(lambda: any("config reload: no change" in line for line in server.lines))
        assert (await infer(http, url, {"input": "still here"}))[0] == 200
    finally:
        code = server.stop()
    output = "".join(server.lines)
    assert code == 0 and "config reload: no change" in output, output
    assert sum("inferd ready on" in line for line in server.lines) == 1
    assert sum("listening on" in line for line in server.lines) == 1


async def test_version_and_check_config_build_nothing(tmp_path):
    good = write_config(tmp_path / "good.toml", SLOW_MODEL)
    bad = write_config(tmp_path / "bad.toml", SLOW_MODEL.replace("grace_period_s = 10", 'grace_period_s = "10"')
                       + '\n[[models]]\nname = "two"\nbackend = "x"\nmax_wait = 3\n[tiers]\nfree = 3\n')
    backends = write_config(tmp_path / "backends.toml", SLOW_MODEL.replace("latency_ms", "latncy_ms")
                            + '\n[[models]]\nname = "two"\nbackend = "no_such_module:create"\n'
                            + '\n[[models]]\nname = "three"\nbackend = "inferd.backends.transformer"\n'
                            + f'[models.options]\nmodel_path = "{tmp_path}/missing"\n')
    results = []
    for args in (["--version"], ["check-config", str(good)], ["check-config", str(bad)], ["check-config", str(backends)]):
        proc = await asyncio.create_subprocess_exec(PYTHON, "-m", "inferd", *args, stdout=asyncio.subprocess.PIPE,
                                                    stderr=asyncio.subprocess.STDOUT)
        out, _ = await asyncio.wait_for(proc.communicate(), 60)
        results.append((proc.returncode, out.decode()))
    assert results[0][0] == 0 and results[0][1].startswith("inferd 0.")
    assert results[1][0] == 0 and "valid" in results[1][1] and "slow (batch" in results[1][1]
    assert results[2][0] == 2 and "`grace_period_s` must be a number" in results[2][1]
    assert "unknown keys 'max_wait' (did you mean 'max_wait_ms'?)" in results[2][1] and "[tiers.free]" in results[2][1]
    assert "No module named 'x'" in results[2][1]  # every mistake at once: a table's backend, though the table is wrong
    assert results[3][0] == 2 and "unknown options ['latncy_ms']" in results[3][1]  # what serve would refuse
    assert "No module named 'no_such_module'" in results[3][1] and "missing' not found" in results[3][1]
    assert "Traceback" not in results[2][1] + results[3][1]


@pytest.mark.skipif(shutil.which("make") is None or shutil.which("curl") is None, reason="make or curl is missing")
async def test_the_readme_generation_walkthrough_runs_as_written(http, tmp_path):
    """`make run-generation`, then the README's lines between its generation-walkthrough markers, with
    the port moved off 8000 so it cannot clash."""
    readme = (REPO / "README.md").read_text()
    block = readme.split("<!-- generation-walkthrough -->")[1].split("<!-- /generation-walkthrough -->")[0]
    script = block.strip().removeprefix("```").removesuffix("```").strip()
    server = ServerProcess(["make", "--no-print-directory", "run-generation", "ARGS=--port 0"], cwd=REPO,
                           env={"VLLM_LOGGING_CONFIG_PATH": ""})  # (as a shell has it: not this process's file)
    try:
        url = await asyncio.to_thread(server.wait_listening, 300)
        await _wait_ready(http, url, timeout_s=300)
        port = url.rsplit(":", 1)[1]
        proc = await asyncio.create_subprocess_exec(
            "bash", "-euo", "pipefail", "-c", script.replace("8000", port), cwd=REPO,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
        output, _ = await asyncio.wait_for(proc.communicate(), 120)
    finally:
        server.stop(whole_group=True)
    text = output.decode()
    assert proc.returncode == 0, text
    assert '"object":"text_completion"' in text and '"finish_reason":"length"' in text  # the completion
    assert text.count("data: ") >= 2 and '"done":true' in text  # the stream, to its last event
    # (The openai client's chat calls: an error there would have made the script's exit status non-zero.)
    assert re.search(r'^get_weather \{"city": ?"(Paris|Oslo)"\}$', text, re.M), text  # "required": a call that parses
    assert text.rstrip().splitlines()[-1] in ("stop", "length")  # "auto" after the tool's answer: served
    # vLLM's engine said its config in one cut line (it was 3.3 KB), and no other line runs on
    engine_line = [line for line in server.lines if "Initializing a V1 LLM engine" in line]
    assert engine_line and "characters more at VLLM_LOGGING_LEVEL=DEBUG" in engine_line[0], engine_line
    assert max(len(line) for line in server.lines) < 1000, max(server.lines, key=len)


def _readme_block(marker: str) -> str:
    readme = (REPO / "README.md").read_text()
    block = readme.split(f"<!-- {marker} -->")[1].split(f"<!-- /{marker} -->")[0]
    return block.strip().removeprefix("```").removesuffix("```").strip()


@pytest.mark.skipif(shutil.which("curl") is None, reason="curl is missing")
async def test_the_readme_models_walkthrough_runs_as_written(http, tmp_path):
    """The README's reranker, image and second-version lines, as written but for where they run: the
    models made in a temporary folder (not the checkout's .models), the server on a free port."""
    def here(text: str) -> str:
        return text.replace(".venv/bin/", f"{REPO}/.venv/bin/").replace(".models/", f"{tmp_path}/")

    *making, serving = here(_readme_block("models-walkthrough")).splitlines()
    made = await asyncio.create_subprocess_exec("bash", "-euo", "pipefail", "-c", "\n".join(making), cwd=tmp_path)
    assert await asyncio.wait_for(made.wait(), 300) == 0
    server = ServerProcess([*serving.split(), "--port", "0"], cwd=tmp_path)
    try:
        url = await asyncio.to_thread(server.wait_listening, 120)
        await _wait_ready(http, url, timeout_s=300)
        port = url.rsplit(":", 1)[1]
        calls = here(_readme_block("models-calls")).replace("8000", port)
        before, _, put = calls.rpartition("\n")  # (the traffic split waits for version 2 to be ready, as it says)

        async def run(script: str) -> str:
            proc = await asyncio.create_subprocess_exec("bash", "-euo", "pipefail", "-c", script, cwd=tmp_path,
                                                        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT)
            output, _ = await asyncio.wait_for(proc.communicate(), 120)
            assert proc.returncode == 0, output.decode()
            return output.decode()

        text = await run(before)
        await _wait_for(http, f"{url}/v1/models/reranker", lambda body: body["other_versions"].get("2", {}).get("state")
                        == "ready", timeout_s=120)
        split = await run("A='Authorization: Bearer s3cret'\n" + put)
        async with http.get(f"{url}/v1/models/reranker") as resp:
            traffic = (await resp.json())["traffic"]
    finally:
        server.stop()
    assert re.search(r'\[\{"index":\d,"score":', text) and text.count('"index"') == 2, text  # TEI's: both texts, best first
    assert re.search(r'"output":\[-?\d', text) and '"model":"vit"' in text, text  # the image's vector
    assert '"state":"loading"' in text and '"2"' in split and traffic == {"1": 0.9, "2": 0.1}, (text, split, traffic)
