"""`/docs`, the interactive API page: served from the process (no CDN), and used in a real browser
(headless Chromium, driven over its DevTools protocol): the page lists the routes, and "Try it out" on
`/v1/inference` gets the server's answer. The browser part skips, saying why, where Chromium is missing
(`.ci/run` installs Debian's)."""

from __future__ import annotations

import asyncio
import re
import shutil
import tempfile
from pathlib import Path

import aiohttp
import orjson
import pytest
from swagger_ui_bundle import swagger_ui_path

from ..helpers import running_server, sim_model

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")

# Runs in the page: waits for Swagger UI to list the routes, opens /v1/inference, presses "Try it out",
# writes a body, presses "Execute" and returns what the page shows as the server's answer.
TRY_IT_OUT = r"""
(async () => {
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  const until = async (what, find) => {
    for (let i = 0; i < 300; i++) { const found = find(); if (found) return found; await sleep(50); }
    throw new Error("the page never showed " + what);
  };
  const paths = await until("its routes", () => {
    const shown = [...document.querySelectorAll(".opblock-summary-path")].map(e => e.textContent.trim());
    return shown.length ? shown : null;
  });
  const block = [...document.querySelectorAll(".opblock-post")]
    .find(b => b.querySelector(".opblock-summary-path").textContent.trim() === "/v1/inference");
  (block.querySelector(".opblock-summary-control") || block.querySelector(".opblock-summary")).click();
  (await until("Try it out", () => block.querySelector(".try-out__btn"))).click();
  const area = await until("the body's editor", () => block.querySelector("textarea.body-param__text"));
  const setValue = Object.getOwnPropertyDescriptor(HTMLTextAreaElement.prototype, "value").set;
  setValue.call(area, JSON.stringify({input: "from the browser", model: "m"}));
  area.dispatchEvent(new Event("input", {bubbles: true}));
  (await until("Execute", () => block.querySelector(".btn.execute"))).click();
  const status = await until("the answer", () => block.querySelector(".live-responses-table tbody .response-col_status"));
  const body = block.querySelector(".live-responses-table .response-col_description pre");
  return {paths, status: status.textContent.trim(), body: body ? body.textContent : ""};
})()
"""


@pytest.mark.asyncio
async def test_the_page_and_its_files_come_from_the_process():
    async with running_server(sim_model("m", latency_ms=2)) as srv, aiohttp.ClientSession() as http:
        async with http.get(f"{srv.url}/docs") as resp:
            page = await resp.text()
            assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/html")
        files = re.findall(r'(?:src|href)="(docs/[^"]+)"', page)
        assert sorted(files) == ["docs/favicon-32x32.png", "docs/swagger-ui-bundle.js", "docs/swagger-ui.css"]
        assert "http" not in page.replace("http-equiv", "")  # (nothing from another host)
        for name in files:
            async with http.get(f"{srv.url}/{name}") as resp:
                body = await resp.read()
                assert resp.status == 200 and body == (Path(str(swagger_ui_path)) / name.removeprefix("docs/")).read_bytes()
                assert "max-age" in resp.headers["Cache-Control"]
        async with http.get(f"{srv.url}/docs/other.js") as resp:
            assert resp.status == 404


async def _devtools(browser: asyncio.subprocess.Process) -> str:
    """The DevTools address Chromium prints on stderr once it listens."""
    assert browser.stderr is not None
    while True:
        line = (await asyncio.wait_for(browser.stderr.readline(), 30)).decode()
        if not line:
            raise AssertionError("chromium exited before it listened")
        found = re.search(r"DevTools listening on ws://([^/]+)/", line)
        if found:
            return found.group(1)


@pytest.mark.asyncio
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (.ci/run installs Debian's `chromium`)")
async def test_try_it_out_in_a_real_browser_gets_the_servers_answer():
    async with running_server(sim_model("m", latency_ms=2)) as srv, aiohttp.ClientSession() as http:
        with tempfile.TemporaryDirectory() as profile:
            browser = await asyncio.create_subprocess_exec(
                CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--remote-debugging-port=0",
                f"--user-data-dir={profile}", "about:blank", stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE)
            try:
                address = await _devtools(browser)
                async with http.get(f"http://{address}/json/list") as resp:
                    target = next(t for t in await resp.json() if t["type"] == "page")
                async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                    ids = iter(range(1, 1000))

                    async def call(method: str, **params) -> dict:
                        sent = next(ids)
                        await ws.send_str(orjson.dumps({"id": sent, "method": method, "params": params}).decode())
                        async for message in ws:
                            data = orjson.loads(message.data)
                            if data.get("id") == sent:
                                assert "error" not in data, data
                                return data["result"]
                        raise AssertionError("the browser hung up")

                    await call("Page.navigate", url=f"{srv.url}/docs")
                    found = await call("Runtime.evaluate", expression=TRY_IT_OUT, awaitPromise=True,
                                       returnByValue=True, timeout=30000)
            finally:
                browser.kill()
                await browser.wait()
    assert "exceptionDetails" not in found, found
    shown = found["result"]["value"]
    assert {"/v1/inference", "/v1/embeddings", "/readyz"} <= set(shown["paths"]), shown["paths"]
    assert shown["status"] == "200", shown
    assert orjson.loads(shown["body"])["model"] == "m"
