"""`/docs`, the interactive API page: served from the process (no CDN), and used in a real browser
(headless Chromium, driven over its DevTools protocol): the page lists the routes in their ecosystems'
groups, "Try it out" on `/v1/inference` gets the server's answer, and "Execute" on every route, with the
examples the page fills in, gets a documented answer from `make run`'s config (a 200 where it serves
the route whole). The browser part skips, saying why, where Chromium is missing
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

# What both scripts below wait with: `until(what, find)` polls `find` (every 50 ms, 20 s at most).
UNTIL = r"""
  const sleep = ms => new Promise(r => setTimeout(r, ms));
  const until = async (what, find) => {
    for (let i = 0; i < 400; i++) { const found = find(); if (found) return found; await sleep(50); }
    throw new Error("the page never showed " + what);
  };
"""
# Runs in the page: waits for Swagger UI to list the routes, opens /v1/inference, presses "Try it out",
# writes a body, presses "Execute" and returns what the page shows as the server's answer.
TRY_IT_OUT = r"""
(async () => {""" + UNTIL + r"""
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


async def _in_browser(http: aiohttp.ClientSession, url: str, script: str) -> dict:
    """`script` evaluated (awaited) in headless Chromium on the page at `url`: what it returned."""
    assert CHROMIUM is not None
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

                await call("Page.navigate", url=url)
                return await call("Runtime.evaluate", expression=script, awaitPromise=True, returnByValue=True,
                                  timeout=90000)
        finally:
            browser.kill()
            await browser.wait()


@pytest.mark.asyncio
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (.ci/run installs Debian's `chromium`)")
async def test_try_it_out_in_a_real_browser_gets_the_servers_answer():
    async with running_server(sim_model("m", latency_ms=2)) as srv, aiohttp.ClientSession() as http:
        found = await _in_browser(http, f"{srv.url}/docs", TRY_IT_OUT)
    assert "exceptionDetails" not in found, found
    shown = found["result"]["value"]
    assert {"/v1/inference", "/v1/embeddings", "/readyz"} <= set(shown["paths"]), shown["paths"]
    assert shown["status"] == "200", shown
    assert orjson.loads(shown["body"])["model"] == "m"


# Runs in the page: for every route, open it, press "Try it out" (its examples filled in by the page)
# and "Execute"; returns each route's method, path and the status the page shows.
EXECUTE_EVERY_ROUTE = r"""
(async () => {""" + UNTIL + r"""
  await until("its routes", () => document.querySelectorAll(".opblock").length > 20);
  const groups = [...document.querySelectorAll(".opblock-tag")].map(t => t.textContent.trim());
  const shown = [];
  for (const block of document.querySelectorAll(".opblock")) {
    const path = block.querySelector(".opblock-summary-path").getAttribute("data-path")
      || block.querySelector(".opblock-summary-path").textContent.trim();
    const method = block.querySelector(".opblock-summary-method").textContent.trim();
    (block.querySelector(".opblock-summary-control") || block.querySelector(".opblock-summary")).click();
    (await until("Try it out on " + path, () => block.querySelector(".try-out__btn"))).click();
    (await until("Execute on " + path, () => block.querySelector(".btn.execute"))).click();
    const status = await until("the answer to " + path,
      () => block.querySelector(".live-responses-table tbody .response-col_status"));
    shown.push({method, path, status: status.textContent.trim().slice(0, 3)});
    (block.querySelector(".opblock-summary-control") || block.querySelector(".opblock-summary")).click();  // (closed again:
    // an open route's answer stays on the page, and each one open makes the next render slower)
  }
  return {groups, shown};
})()
"""


def _default_models():  # type: ignore[no-untyped-def]
    from inferd.config import load_config

    return load_config(str(Path(__file__).resolve().parents[2] / "config" / "default.toml")).models  # (make run's)


def _documented(document: dict, method: str, path: str) -> set[str]:
    return set(document["paths"][path][method.lower()]["responses"])


# Routes the default config serves whole: their examples must be answered 200 (the rest: a documented
# answer, e.g. a 404 naming the model kind the default config lacks, or a 401 for the admin key).
ANSWERED_WHOLE = {"/v1/inference", "/api/inference", "/v1/embeddings", "/embeddings", "/embed", "/", "/similarity", "/embed_all",
                  "/v2/embed", "/tokenize", "/decode", "/v2/models/{model}/infer", "/v2/models/{model}/versions/{version}/infer",
                  "/v1/models/{model}", "/v2/models/{model}", "/healthz", "/readyz", "/health", "/ping", "/info", "/v1/models"}


async def test_every_routes_example_is_answered_as_documented_by_the_default_config():
    async with running_server(*_default_models(), ready_timeout_s=120) as srv, aiohttp.ClientSession() as http:
        async with http.get(f"{srv.url}/openapi.json") as resp:
            document = await resp.json()
        answered = {}
        for path, item in document["paths"].items():
            for method, operation in item.items():
                url = path
                for parameter in operation.get("parameters", []):
                    if parameter["in"] == "path":
                        url = url.replace("{" + parameter["name"] + "}", parameter["example"])
                body = operation.get("requestBody", {}).get("content", {}).get("application/json", {}).get("example")
                async with http.request(method.upper(), srv.url + url, json=body) as resp:
                    answered[(method.upper(), path)] = str(resp.status), (await resp.read())[:300]
    assert {op["tags"][0] for item in document["paths"].values() for op in item.values()} >= {
        "inferd", "OpenAI", "Text Embeddings Inference", "Infinity", "KServe v2 and Triton", "operations"}
    for (method, path), (status, body) in answered.items():
        assert status in _documented(document, method, path), (method, path, status, body)
        if path in ANSWERED_WHOLE:
            assert status == "200", (method, path, status, body)


@pytest.mark.asyncio
@pytest.mark.skipif(CHROMIUM is None, reason="no Chromium here (.ci/run installs Debian's `chromium`)")
async def test_execute_on_every_route_in_a_real_browser_gets_a_documented_answer():
    async with running_server(*_default_models(), ready_timeout_s=120) as srv, aiohttp.ClientSession() as http:
        async with http.get(f"{srv.url}/openapi.json") as resp:
            document = await resp.json()
        found = await _in_browser(http, f"{srv.url}/docs", EXECUTE_EVERY_ROUTE)
    assert "exceptionDetails" not in found, found
    shown = found["result"]["value"]
    assert {"inferd", "OpenAI", "Text Embeddings Inference", "Infinity", "operations"} <= set(shown["groups"]), shown["groups"]
    routes = {(method, path) for path, item in document["paths"].items() for method in item}
    assert {(r["method"].lower(), r["path"]) for r in shown["shown"]} == routes
    for route in shown["shown"]:
        assert route["status"] in _documented(document, route["method"], route["path"]), route
        if route["path"] in ANSWERED_WHOLE:
            assert route["status"] == "200", route
