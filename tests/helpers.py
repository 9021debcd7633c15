"""What many tests share: the real server on loopback (in the test's event loop, or as a child process),
small HTTP helpers, and a fake clock for the pure logic."""

from __future__ import annotations

import gc
import os
import re
import signal
import subprocess
import sys
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiohttp

from inferd.config import ModelConfig, ServerConfig
from inferd.server import InferenceServer

REPO = Path(__file__).resolve().parent.parent


def sim_model(name: str = "m", *, latency_ms: float = 20, backend: str = "inferd.backends.sim:create", **kw: Any) -> ModelConfig:
    """A simulated-GPU model with test-friendly defaults; `options` extends the sim's options."""
    options = {"latency_ms": latency_ms, "max_batch_size": kw.get("max_batch_size", 32), "record_inputs": True}
    options.update(kw.pop("options", {}))
    kw.setdefault("max_wait_ms", 5)
    return ModelConfig(name=name, backend=backend, options=options, **kw)


@asynccontextmanager
async def running_server(
    *models: ModelConfig, wait_ready: bool = True, ready_timeout_s: float = 60, span_exporter: Any = None, **server: Any
) -> AsyncIterator[InferenceServer]:
    """The real InferenceServer listening on 127.0.0.1 with a free port, stopped (drained) afterwards.
    Once ready, the heap so far is hidden from the collector, as `inferd serve` does (gc.freeze): else a
    full collection walks everything the suite's earlier tests imported (vLLM, torch) and stalls the
    loop that both this server and the test's client run on for most of a second."""
    config = ServerConfig(host="127.0.0.1", port=0, models=models or (sim_model(),), **server)
    srv = InferenceServer(config, span_exporter=span_exporter)
    await srv.start()
    try:
        if wait_ready:
            await srv.wait_ready(ready_timeout_s)
        gc.freeze()
        yield srv
    finally:
        gc.unfreeze()
        await srv.drain_and_stop()


async def infer(http: aiohttp.ClientSession, url: str, body: Any, **kw: Any) -> tuple[int, dict, Any]:
    """POST /v1/inference; returns (status, json body, headers)."""
    data = body if isinstance(body, (bytes, str)) else None
    async with http.post(f"{url}/v1/inference", json=None if data is not None else body, data=data, **kw) as resp:
        return resp.status, await resp.json(content_type=None), resp.headers


def backend_of(server: InferenceServer, model: str = "m", worker: int = 0) -> Any:
    return server.models.batch[model].pool.workers[worker].backend


class ServerProcess:
    """`python -m inferd serve` as a child process (for signals and the CLI)."""

    def __init__(self, args: list[str], env: dict[str, str] | None = None, cwd: Path = REPO) -> None:
        self.proc = subprocess.Popen(
            args,
            cwd=cwd,
            env={**os.environ, **(env or {})},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: list[str] = []
        self._url = threading.Event()
        self.url = ""
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.append(line)
            match = re.search(r"inferd listening on (http://\S+)", line)
            if match and not self.url:
                self.url = match.group(1)
                self._url.set()

    def wait_listening(self, timeout_s: float = 60) -> str:
        if not self._url.wait(timeout_s):
            self.stop()
            raise TimeoutError("server did not start:\n" + "".join(self.lines))
        return self.url

    def signal(self, sig: int) -> None:
        self.proc.send_signal(sig)

    def stop(self, timeout_s: float = 30, whole_group: bool = False) -> int:
        """SIGTERM the child (or the process group it leads, e.g. make and its server) and wait for it
        and for its output to close, which happens once every process holding it has exited."""
        if self.proc.poll() is None:
            if whole_group:
                os.killpg(self.proc.pid, signal.SIGTERM)
            else:
                self.proc.send_signal(signal.SIGTERM)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            code = self.proc.wait()
        self._reader.join(timeout_s)
        return code


def write_config(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


PYTHON = sys.executable


class FakeClock:
    """A clock a test moves by hand: `clock()` is now, `advance(s)` moves it."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> float:
        self.now += seconds
        return self.now


async def until(condition, timeout_s: float = 10.0, step_s: float = 0.002) -> None:  # type: ignore[no-untyped-def]
    """Wait until `condition()` holds (a state the test is waiting for, not a time), or fail. An async
    `condition` (one that asks a server in another process, say) is awaited each time."""
    import asyncio
    import inspect

    loop = asyncio.get_running_loop()
    give_up = loop.time() + timeout_s
    while not (await held if inspect.isawaitable(held := condition()) else held):
        if loop.time() > give_up:
            raise AssertionError(f"condition not met within {timeout_s} s")
        await asyncio.sleep(step_s)


class RecordingTransport:
    """A connection's transport without a socket (drive a connection by calling its `data_received`): keeps
    what the server writes, and calls `on_write` after each write."""

    def __init__(self) -> None:
        self.out = bytearray()
        self.on_write: Any = None

    def write(self, data: bytes) -> None:
        self.out += data
        if self.on_write is not None:
            self.on_write()

    def is_closing(self) -> bool:
        return False

    def close(self) -> None:
        pass

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass

    def get_write_buffer_size(self) -> int:
        return 0


def build_tiny_vit(path: Path) -> str:
    """A random-weight ViT of 32 px images saved to `path` (`small_models`): what the image backend's
    tests load."""
    from inferd.backends.small_models import build_tiny_vit as build

    return str(build(path))
