"""The synchronous and asyncio clients (see the package's docstring for what they promise)."""

from __future__ import annotations

import asyncio
import http.client
import json
import os
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from .errors import ConnectionFailed, ConnectionLost, error_from, retry_delay_s


@dataclass(frozen=True)
class Answer:
    """One input's result."""

    output: Any
    request_id: str
    model: str
    latency_ms: float  # inside the server
    attempts: int  # 1, or more when 503s or refused connections were retried


def _new_request_id() -> str:
    return "cli_" + os.urandom(8).hex()


_REUSE_IDLE_S = 30.0  # a kept-alive connection idle longer is not reused (inferd closes them at 75 s)


class _Calls:
    """What both clients share: the URL, the key, the retry rule, the bodies."""

    def __init__(self, url: str, api_key: str | None, timeout_s: float, retries: int, model: str | None) -> None:
        self.url = url.rstrip("/")
        self.timeout_s = timeout_s
        self.retries = retries
        self.model = model
        self.headers = {"Content-Type": "application/json"}
        if api_key:
            self.headers["Authorization"] = f"Bearer {api_key}"

    def inference_body(self, text: str, model: str | None, timeout_ms: int | None, extra: dict[str, Any]) -> bytes:
        body: dict[str, Any] = {"input": text, **extra}
        if model or self.model:
            body["model"] = model or self.model
        body["timeout_ms"] = timeout_ms or int(self.timeout_s * 1000)
        return json.dumps(body).encode()

    def answer(self, data: dict[str, Any], attempts: int) -> Answer:
        return Answer(data["output"], data["request_id"], data["model"], data["latency_ms"], attempts)


class Client(_Calls):
    """inferd, synchronously. One kept-alive connection: use one client per thread."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 30.0, retries: int = 3,
                 model: str | None = None) -> None:
        super().__init__(url, api_key, timeout_s, retries, model)
        parts = urlsplit(self.url)
        self._host, self._port = parts.hostname or "127.0.0.1", parts.port or 80
        self._conn: http.client.HTTPConnection | None = None
        self._last_used = 0.0

    def infer(self, text: str, *, model: str | None = None, timeout_ms: int | None = None,
              request_id: str | None = None, idempotency_key: str | None = None) -> Answer:
        """`idempotency_key`: the server answers this request once however often it is sent, so a lost
        connection is retried too."""
        body = self.inference_body(text, model, timeout_ms, {})
        status, data, attempts = self._call("/v1/inference", body, request_id, idempotency_key)
        return self.answer(data, attempts)

    def generate(self, prompt: str, *, model: str | None = None, timeout_ms: int | None = None, **sampling: Any) -> str:
        return self._call("/v1/inference", self.inference_body(prompt, model, timeout_ms, sampling), None)[1]["output"]

    def embed(self, inputs: list[str], *, model: str | None = None) -> list[list[float]]:
        body = json.dumps({"input": inputs, **({"model": model or self.model} if model or self.model else {})}).encode()
        return [item["embedding"] for item in self._call("/v1/embeddings", body, None)[1]["data"]]

    def stream(self, prompt: str, *, model: str | None = None, timeout_ms: int | None = None,
               **sampling: Any) -> Iterator[str]:
        """A generation's text as it comes (Server-Sent Events); an error mid-stream raises."""
        body = self.inference_body(prompt, model, timeout_ms, {**sampling, "stream": True})
        response = self._send("/v1/inference", body, _new_request_id())
        try:
            if response.status != 200:
                raise error_from(response.status, response.read())
            for line in response:
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise error_from(504 if event["error"] == "DEADLINE_EXCEEDED" else 500, line[6:])
                    yield event.get("delta", "")
        finally:
            if not response.isclosed():  # left before its end: the connection cannot carry another request
                self.close()

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _call(self, path: str, body: bytes, request_id: str | None,
              idempotency_key: str | None = None) -> tuple[int, dict[str, Any], int]:
        request_id = request_id or _new_request_id()
        give_up = time.monotonic() + self.timeout_s
        for attempt in range(1, self.retries + 2):
            try:
                response = self._send(path, body, request_id, idempotency_key)
                payload = response.read()
                if response.status == 200:
                    return 200, json.loads(payload), attempt
                error = error_from(response.status, payload)
            except ConnectionRefusedError as exc:
                self.close()
                error = ConnectionFailed(f"cannot connect to {self.url}: {exc}", request_id=request_id)
            except (OSError, http.client.HTTPException) as exc:
                self.close()
                error = ConnectionLost(f"connection to {self.url} lost: {exc!r}", request_id=request_id)
            delay = (retry_delay_s(error, attempt, give_up - time.monotonic(), idempotency_key is not None)
                     if attempt <= self.retries else None)
            if delay is None:
                raise error
            time.sleep(delay)
        raise AssertionError("unreachable")

    def _send(self, path: str, body: bytes, request_id: str, idempotency_key: str | None = None) -> http.client.HTTPResponse:
        now = time.monotonic()
        if self._conn is not None and now - self._last_used > _REUSE_IDLE_S:
            self.close()  # the server may be closing it as idle: a request sent on it could be lost
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self._host, self._port, timeout=self.timeout_s + 5)
        self._last_used = now
        headers = {**self.headers, "X-Request-ID": request_id}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        self._conn.request("POST", path, body, headers)
        return self._conn.getresponse()


class AsyncClient(_Calls):
    """inferd, on asyncio (aiohttp). Pass a `session` to share one; else the client makes its own."""

    def __init__(self, url: str, *, api_key: str | None = None, timeout_s: float = 30.0, retries: int = 3,
                 model: str | None = None, session: aiohttp.ClientSession | None = None) -> None:
        super().__init__(url, api_key, timeout_s, retries, model)
        self._session = session
        self._own_session = session is None

    async def infer(self, text: str, *, model: str | None = None, timeout_ms: int | None = None,
                    request_id: str | None = None, idempotency_key: str | None = None) -> Answer:
        body = self.inference_body(text, model, timeout_ms, {})
        data, attempts = await self._call("/v1/inference", body, request_id, idempotency_key)
        return self.answer(data, attempts)

    async def generate(self, prompt: str, *, model: str | None = None, timeout_ms: int | None = None,
                       **sampling: Any) -> str:
        return (await self._call("/v1/inference", self.inference_body(prompt, model, timeout_ms, sampling), None))[0]["output"]

    async def embed(self, inputs: list[str], *, model: str | None = None) -> list[list[float]]:
        body = json.dumps({"input": inputs, **({"model": model or self.model} if model or self.model else {})}).encode()
        return [item["embedding"] for item in (await self._call("/v1/embeddings", body, None))[0]["data"]]

    async def stream(self, prompt: str, *, model: str | None = None, timeout_ms: int | None = None,
                     **sampling: Any) -> AsyncIterator[str]:
        body = self.inference_body(prompt, model, timeout_ms, {**sampling, "stream": True})
        async with self._http().post(f"{self.url}/v1/inference", data=body,
                                     headers={**self.headers, "X-Request-ID": _new_request_id()}) as resp:
            if resp.status != 200:
                raise error_from(resp.status, await resp.read())
            async for line in resp.content:
                if line.startswith(b"data: "):
                    event = json.loads(line[6:])
                    if "error" in event:
                        raise error_from(504 if event["error"] == "DEADLINE_EXCEEDED" else 500, line[6:])
                    yield event.get("delta", "")

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
            self._session = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=self.timeout_s + 5))
        return self._session

    async def _call(self, path: str, body: bytes, request_id: str | None,
                    idempotency_key: str | None = None) -> tuple[dict[str, Any], int]:
        request_id = request_id or _new_request_id()
        loop = asyncio.get_running_loop()
        give_up = loop.time() + self.timeout_s
        headers = {**self.headers, "X-Request-ID": request_id}
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        for attempt in range(1, self.retries + 2):
            try:
                async with self._http().post(f"{self.url}{path}", data=body, headers=headers) as resp:
                    payload = await resp.read()
                    if resp.status == 200:
                        return json.loads(payload), attempt
                    error = error_from(resp.status, payload)
            except aiohttp.ClientConnectorError as exc:
                error = ConnectionFailed(f"cannot connect to {self.url}: {exc}", request_id=request_id)
            except (aiohttp.ClientError, TimeoutError) as exc:
                error = ConnectionLost(f"connection to {self.url} lost: {exc!r}", request_id=request_id)
            delay = (retry_delay_s(error, attempt, give_up - loop.time(), idempotency_key is not None)
                     if attempt <= self.retries else None)
            if delay is None:
                raise error
            await asyncio.sleep(delay)
        raise AssertionError("unreachable")
