"""The product's shape with nothing of inferd in it: the floor under inferd's request path.

One uvloop event loop; aiohttp's C HTTP parser reading each connection; each request's JSON body read
with orjson, its input queued with an asyncio future; one executor thread taking batches of up to
`--max-batch` (waiting up to `--linger-ms` for a batch to fill), sleeping `--batch-ms` as S2's
simulated GPU does and upper-casing the inputs (Mosec's `benchmarks/mosec/upper.py`); each batch
handed back to the loop in one `call_soon_threadsafe`, each future resolved there and its answer
(`{"output": ...}`, fixed headers) written from its done-callback. No admission, routing, request ids,
deadlines, metrics, logs, timing headers, collapsing, cost model or error handling beyond what keeps it
running: what any server of this shape pays per request, whatever it does besides.

Benchmark-only (`benchmarks/scenarios/shape_floor.py` runs it beside inferd and Mosec).

    python bare_shape.py --port N [--batch-ms 10] [--max-batch 100] [--linger-ms 20]

A POST to any path with `{"input": "..."}` (`/inference`, `/v1/inference`); a GET to any path answers
the batches run (`/stats`).
"""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections import deque
from typing import Any

import orjson
import uvloop
from aiohttp._http_parser import HttpRequestParser
from aiohttp.base_protocol import BaseProtocol

_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nServer: floor\r\nContent-Length: %d\r\n\r\n"


class Batches:
    """The queue, the executor thread that takes batches from it, and the hand-back to the loop."""

    def __init__(self, loop: asyncio.AbstractEventLoop, batch_s: float, max_batch: int, linger_s: float) -> None:
        self.loop = loop
        self.batch_s, self.max_batch, self.linger_s = batch_s, max_batch, linger_s
        self.waiting: deque[tuple[str, asyncio.Future]] = deque()
        self.ready = threading.Condition()
        self.count = 0
        threading.Thread(target=self._run, name="executor", daemon=True).start()

    def put(self, text: str, future: asyncio.Future) -> None:
        with self.ready:
            self.waiting.append((text, future))
            if len(self.waiting) == 1 or len(self.waiting) >= self.max_batch:
                self.ready.notify()

    def _run(self) -> None:
        while True:
            with self.ready:
                while not self.waiting:
                    self.ready.wait()
                until = time.monotonic() + self.linger_s
                while len(self.waiting) < self.max_batch and (left := until - time.monotonic()) > 0:
                    self.ready.wait(left)
                batch = [self.waiting.popleft() for _ in range(min(self.max_batch, len(self.waiting)))]
            time.sleep(self.batch_s)  # (the simulated GPU)
            outputs = [text.upper() for text, _ in batch]
            self.count += 1
            self.loop.call_soon_threadsafe(_resolve, batch, outputs)


def _resolve(batch: list[tuple[str, asyncio.Future]], outputs: list[str]) -> None:
    for (_, future), output in zip(batch, outputs):
        if not future.done():
            future.set_result(output)


class Connection(BaseProtocol):
    """One client connection: requests parsed by aiohttp's parser, answered from their futures."""

    def __init__(self, loop: asyncio.AbstractEventLoop, batches: Batches) -> None:
        super().__init__(loop)
        self.batches = batches
        self.parser = HttpRequestParser(self, loop, 2**16)

    def data_received(self, data: bytes) -> None:
        messages, _, _ = self.parser.feed_data(data)
        for message, payload in messages:
            if message.method == "GET":
                self._write(orjson.dumps({"batches": self.batches.count}))
                continue
            if payload.is_eof():  # (the whole body came with its headers: wrk's requests)
                self._queue(b"".join(payload._buffer))
            else:  # (the rest comes in later reads: the parser feeds it to the payload)
                asyncio.ensure_future(self._read_then_queue(payload))

    async def _read_then_queue(self, payload: Any) -> None:
        self._queue(await payload.read())

    def _queue(self, body: bytes) -> None:
        future = self._loop.create_future()
        future.add_done_callback(self._answered)
        self.batches.put(orjson.loads(body)["input"], future)

    def _answered(self, future: asyncio.Future) -> None:
        self._write(orjson.dumps({"output": future.result()}))

    def _write(self, body: bytes) -> None:
        if self.transport is not None:
            self.transport.write(_HEAD % len(body) + body)


async def serve(port: int, batch_s: float, max_batch: int, linger_s: float) -> None:
    loop = asyncio.get_running_loop()
    batches = Batches(loop, batch_s, max_batch, linger_s)
    server = await loop.create_server(lambda: Connection(loop, batches), "127.0.0.1", port, backlog=1024)
    async with server:
        await server.serve_forever()


def main(argv: Any = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--batch-ms", type=float, default=10.0)
    parser.add_argument("--max-batch", type=int, default=100)
    parser.add_argument("--linger-ms", type=float, default=20.0)
    args = parser.parse_args(argv)
    uvloop.run(serve(args.port, args.batch_ms / 1000, args.max_batch, args.linger_ms / 1000))


if __name__ == "__main__":
    main()
