"""One batch per cycle on the floor of the front end: a bare aiohttp + uvloop + orjson server that is
told how many closed-loop clients there are (an oracle no real server has), gathers exactly that many
requests (at most `--max-batch`), holds them for `--batch-ms` as the seed's function takes, and
answers them all; one batch at a time, the next as soon as as many wait again.

What a closed loop can get at most on this host with this client: each cycle is the batch plus the
time the client and the barest server on this stack take to trade the answers for the next requests.
`benchmarks/scenarios/closed_loop_sweep.py` runs it beside inferd, one process per step.

    python benchmarks/floor/one_batch_per_cycle.py --port 8099 --clients 50 --batch-ms 100
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import itertools

import orjson
import uvloop
from aiohttp import web


def answer(text: str, number: int, latency_ms: float) -> bytes:
    """The simulated model's answer for `text`, in the shape inferd's `/v1/inference` writes it."""
    digest = hashlib.blake2b(text.encode("utf-8", "surrogatepass"), digest_size=6).hexdigest()
    return orjson.dumps(
        {
            "output": f"{text}=>{digest}",
            "request_id": f"req_{number:09x}",
            "model": "batchstring",
            "model_version": "1",
            "latency_ms": round(latency_ms, 3),
        }
    )


async def serve(port: int, gather: int, batch_s: float) -> None:
    waiting: list[tuple[str, float, asyncio.Future[bytes]]] = []
    numbers = itertools.count()
    enough = asyncio.Event()
    loop = asyncio.get_running_loop()

    async def infer(request: web.Request) -> web.Response:
        future: asyncio.Future[bytes] = loop.create_future()
        waiting.append((orjson.loads(await request.read())["input"], loop.time(), future))
        if len(waiting) >= gather:
            enough.set()
        return web.Response(body=await future, content_type="application/json")

    async def batches() -> None:
        while True:
            await enough.wait()
            batch = waiting[:gather]
            del waiting[:gather]
            if len(waiting) < gather:
                enough.clear()
            await asyncio.sleep(batch_s)
            now = loop.time()
            for text, came, future in batch:
                if not future.done():
                    future.set_result(answer(text, next(numbers), (now - came) * 1000))

    app = web.Application()
    app.router.add_post("/v1/inference", infer)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    print(f"listening on http://127.0.0.1:{port}", flush=True)
    await batches()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--clients", type=int, required=True)
    parser.add_argument("--batch-ms", type=float, default=100.0)
    parser.add_argument("--max-batch", type=int, default=100)
    args = parser.parse_args()
    uvloop.run(serve(args.port, min(args.clients, args.max_batch), args.batch_ms / 1000))
