"""The accounting client: open-loop Poisson load with a unique X-Request-ID per request, recording what
came back for each one. Run inside the lab's client namespace:

    python -m tests.e2e.multihost.client --url http://ADDR:8080 --rate 200 --duration 20 --out result.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time

import aiohttp

from inferd.backends.sim import expected_output
from inferd.bench.loadgen import open_loop
from inferd.client import AsyncClient, InferdClientError, NotFromInferd


async def run(url: str, rate: float, duration_s: float, timeout_s: float, prefix: str) -> dict:
    rng = random.Random(17)
    loop = asyncio.get_running_loop()
    records: list[dict] = []

    async def one(client: AsyncClient, i: int, scheduled: float) -> None:
        rid = f"{prefix}-{i}"
        record = {"id": rid, "sent_at": round(scheduled - began, 4)}
        try:
            answer = await client.infer(rid, request_id=rid)
            record.update(status=200, error=None,
                          right=answer.output == expected_output(rid) and answer.request_id == rid)
        except InferdClientError as error:  # inferd's typed errors, or NOT_FROM_INFERD (the balancer's page)
            record.update(status=error.status, error=error.code, right=True)
            if isinstance(error, NotFromInferd):
                record["detail"] = error.message
        except TimeoutError as exc:
            record.update(status=0, error=type(exc).__name__)
        record["latency_s"] = round(loop.time() - scheduled, 4)
        records.append(record)

    timeout = aiohttp.ClientTimeout(total=timeout_s)
    async with aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=2000)) as session:
        # No retries here: the balancer's are what is measured. The server's deadline stays its own.
        client = AsyncClient(url, retries=0, timeout_s=timeout_s, session=session)
        began = loop.time()
        sent = await open_loop(rate, duration_s, rng, lambda i, scheduled: one(client, i, scheduled), began=began)
    return {"sent": sent, "records": records, "wall_s": round(loop.time() - began, 2)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--url", required=True)
    parser.add_argument("--rate", type=float, default=200)
    parser.add_argument("--duration", type=float, default=20)
    parser.add_argument("--timeout", type=float, default=20)
    parser.add_argument("--prefix", default="mh")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    started = time.time()
    result = asyncio.run(run(args.url, args.rate, args.duration, args.timeout, args.prefix))
    result["started_unix"] = started
    with open(args.out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
