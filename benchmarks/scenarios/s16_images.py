"""S16, images: a ViT-small-shaped encoder (random weights, made on the spot; patch 16) on this
machine's CPU behind `/v1/inference`, images of three native sizes (96, 160 and 224 px, a third each)
sent as base64, open loop (Poisson) at 80% and 120% of capacity.

Two ways to make the sizes compatible, each its own server, alternated:
- **size buckets** (`image_sizes = [96, 160, 224]`): each image at the smallest size that holds it,
  one size per batch;
- **one size** (`image_sizes = [224]`): every image resized to the largest.
Capacity is the size-bucket server's, measured first with closed-loop clients; both variants get the
same offered rates. Every answer is checked against the backend called directly on the same image (its
own prepare and forward, in this process): 0 wrong outputs is the goal. Figures: goodput, p50/p99 per
size class.

Then, the event loop under a flood of 4 MB images (noise PNGs, 8 clients sending back to back):
`GET /healthz` every 20 ms, its p99 (the goal: <= 10 ms).
(The issue named this S13; S13 and S14 were taken.)
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import multiprocessing
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from common import inferd_server, parse_args

SIZES = (96, 160, 224)
PER_SIZE = 6  # distinct images per size class (collapsing is off: repeats are computed again)
CONFIG = """
[server]
access_log = "off"
max_body_bytes = 16777216  # (images: the default, 1 MiB, is sized for text)

[[models]]
name = "vit"
backend = "inferd.backends.vision:create"
max_batch_size = 16
max_wait_ms = 10
max_queue = 2000
timeout_ms = 30000
collapse = false
[models.options]
model_path = "{path}"
image_sizes = {sizes}
max_image_bytes = 8388608
"""


def make_vit(folder: Path) -> str:
    import torch
    from transformers import ViTConfig, ViTImageProcessorPil, ViTModel

    torch.manual_seed(0)
    ViTModel(ViTConfig(image_size=224, patch_size=16, hidden_size=384, num_hidden_layers=12, num_attention_heads=6,
                       intermediate_size=1536)).save_pretrained(folder)
    ViTImageProcessorPil(size={"height": 224, "width": 224}).save_pretrained(folder)
    return str(folder)


def png(width: int, height: int, seed: int) -> bytes:
    from PIL import Image

    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="PNG")
    return out.getvalue()


def expected(path: str, sizes: list[int], images: list[bytes]) -> list[np.ndarray]:
    from inferd.backends.vision import ImageModel

    model = ImageModel("cpu", {"model_path": path, "image_sizes": sizes})
    return [model([p.input])[0] for p in model.prepare_batch(images)]


async def open_loop(url: str, rate: float, seconds: float, bodies: list[bytes], classes: list[int],
                    want: list[np.ndarray]) -> dict:
    import aiohttp

    rng = random.Random(1)
    latency: dict[int, list[float]] = {c: [] for c in set(classes)}
    wrong = errors = in_window = 0
    tasks = []

    async def one(http: aiohttp.ClientSession, i: int) -> None:
        nonlocal wrong, errors, in_window
        started = time.monotonic()
        async with http.post(f"{url}/v1/inference", data=bodies[i], headers={"Content-Type": "application/json"}) as resp:
            answer = await resp.json()
        if resp.status != 200:
            errors += 1
            return
        latency[classes[i]].append((time.monotonic() - started) * 1000)
        in_window += time.monotonic() <= stop
        if np.max(np.abs(np.array(answer["output"], dtype=np.float32) - want[i])) > 1e-3:
            wrong += 1

    stop = time.monotonic() + seconds
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        while time.monotonic() < stop:
            tasks.append(asyncio.create_task(one(http, rng.randrange(len(bodies)))))
            await asyncio.sleep(rng.expovariate(rate))
        await asyncio.gather(*tasks)
    # Goodput: answers within the window (what is still queued at its end is answered afterwards).
    out = {"offered_rps": round(rate, 1), "goodput_rps": round(in_window / seconds, 1), "errors": errors, "wrong": wrong,
           "answered": sum(len(v) for v in latency.values())}
    for size, values in sorted(latency.items()):
        values.sort()
        if values:
            out[f"{size}px"] = {"p50_ms": round(values[len(values) // 2], 1),
                                "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1)}
    return out


async def closed_loop(url: str, bodies: list[bytes], seconds: float, clients: int = 32) -> dict:
    """`clients` each sending a random body of `bodies` back to back: the answers (200) and errors within
    `seconds`."""
    import aiohttp

    done = errors = 0
    stop = time.monotonic() + seconds

    async def client(http: aiohttp.ClientSession, seed: int) -> None:
        nonlocal done, errors
        rng = random.Random(seed)
        while time.monotonic() < stop:
            async with http.post(f"{url}/v1/inference", data=rng.choice(bodies),
                                 headers={"Content-Type": "application/json"}) as resp:
                await resp.read()
            if time.monotonic() < stop:
                done += resp.status == 200
                errors += resp.status != 200

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(*(client(http, s) for s in range(clients)))
    return {"answered": done, "errors": errors}


async def capacity(url: str, bodies: list[bytes], seconds: float) -> float:
    """Answers per second with 32 closed-loop clients."""
    return (await closed_loop(url, bodies, seconds))["answered"] / seconds


def probe_health(url: str, seconds: float, every_s: float, out: Any) -> None:
    """`GET /healthz` every `every_s` on one kept-alive connection, from a process of its own (the
    flood's client loop, busy writing megabytes, would otherwise be what it measures)."""
    import http.client
    from urllib.parse import urlsplit

    where = urlsplit(url)
    connection = http.client.HTTPConnection(where.hostname, where.port, timeout=30)
    stop, took = time.monotonic() + seconds, []
    while time.monotonic() < stop:
        started = time.monotonic()
        connection.request("GET", "/healthz")
        connection.getresponse().read()
        took.append((time.monotonic() - started) * 1000)
        time.sleep(every_s)
    out.put(took)


async def flood(url: str, body: bytes | list[bytes], seconds: float, content_type: str = "application/json") -> dict:
    """8 clients send `body` back to back (or the bodies of a list in turn, each client its own
    sequence: distinct images, which collapsing cannot join) while another process probes /healthz."""
    import aiohttp

    bodies = body if isinstance(body, list) else [body]
    stop = time.monotonic() + seconds
    sent = 0
    results: Any = multiprocessing.Queue()
    prober = multiprocessing.Process(target=probe_health, args=(url, seconds, 0.02, results))
    prober.start()

    async def sender(http: aiohttp.ClientSession, first: int) -> None:
        nonlocal sent
        turn = first
        while time.monotonic() < stop:
            async with http.post(f"{url}/v1/inference", data=bodies[turn % len(bodies)], params={"model": "vit"},
                                 headers={"Content-Type": content_type}) as resp:
                await resp.read()
            sent += resp.status == 200
            turn += 8

    async with aiohttp.ClientSession() as http:
        await asyncio.gather(*(sender(http, i) for i in range(8)))
    health = sorted(results.get(timeout=60))
    prober.join()
    return {"images_sent": sent, "image_mb": round(len(bodies[0]) / 2**20, 2), "healthz_probes": len(health),
            "healthz_p50_ms": round(health[len(health) // 2], 2),
            "healthz_p99_ms": round(health[min(len(health) - 1, int(len(health) * 0.99))], 2)}


def body_of(data: bytes) -> bytes:
    return json.dumps({"model": "vit", "input": {"image": base64.b64encode(data).decode()}}).encode()


if __name__ == "__main__":
    args = parse_args(__doc__)
    seconds = 6 if args.quick else 20
    variants = {"size buckets": list(SIZES), "one size": [SIZES[-1]]}
    with tempfile.TemporaryDirectory() as folder:
        path = make_vit(Path(folder))
        images, classes = [], []
        for size in SIZES:
            for k in range(PER_SIZE):
                images.append(png(size - 4 * k, size, seed=size * 100 + k))  # native sizes near the class's
                classes.append(size)
        bodies = [body_of(d) for d in images]
        want = {label: expected(path, sizes, images) for label, sizes in variants.items()}
        with inferd_server(CONFIG.format(path=path, sizes=variants["size buckets"])) as url:
            asyncio.run(capacity(url, bodies, 3))  # (warm)
            cap = asyncio.run(capacity(url, bodies, seconds / 2))
        print(f"capacity with size buckets: {cap:.1f} req/s", flush=True)
        rows = []
        for load in (0.8, 1.2):
            for label, sizes in variants.items():
                with inferd_server(CONFIG.format(path=path, sizes=sizes)) as url:
                    asyncio.run(capacity(url, bodies, 2))  # (warm)
                    row = asyncio.run(open_loop(url, cap * load, seconds, bodies, classes, want[label]))
                row.update(variant=label, load=load)
                rows.append(row)
                print(json.dumps(row), flush=True)
        big = png(1200, 1200, seed=7)  # ~4 MB of noise
        with inferd_server(CONFIG.format(path=path, sizes=variants["size buckets"])) as url:
            floods = {"JSON, base64": asyncio.run(flood(url, body_of(big), seconds / 2)),
                      "raw image/png body": asyncio.run(flood(url, big, seconds / 2, "image/png"))}
        print(json.dumps(floods), flush=True)
    lines = ["### S16: images on the CPU (ViT-small shape, random weights), 3 native sizes, open loop", "",
             f"Capacity with size buckets: {cap:.1f} req/s (32 closed-loop clients).", "",
             "| load | variant | offered req/s | goodput req/s | errors | wrong | 96 px p50 / p99 ms | 160 px p50 / p99 ms | "
             "224 px p50 / p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = " | ".join(f"{r[f'{s}px']['p50_ms']} / {r[f'{s}px']['p99_ms']}" if f"{s}px" in r else "–" for s in SIZES)
        lines.append(f"| {int(r['load'] * 100)}% | {r['variant']} | {r['offered_rps']:.1f} | {r['goodput_rps']} | "
                     f"{r['errors']} | {r['wrong']} | {cells} |")
    lines += ["", "Under a flood of 4 MB noise PNGs (8 clients back to back), `GET /healthz` every 20 ms (goal: p99 <= 10 ms):",
              "", "| images sent as | body MB | images answered | healthz probes | healthz p50 ms | healthz p99 ms |",
              "|---|---|---|---|---|---|"]
    for how, f in floods.items():
        lines.append(f"| {how} | {f['image_mb']} | {f['images_sent']} | {f['healthz_probes']} | {f['healthz_p50_ms']} | "
                     f"**{f['healthz_p99_ms']}** |")
    lines.append("")
    if not args.quick:
        out = Path(args.out_dir)
        (out / "S16_images.json").write_text(json.dumps({"capacity_rps": cap, "rows": rows, "floods": floods}, indent=1) + "\n")
        (out / "S16_images.md").write_text("\n".join(lines))
    print("\n".join(lines))
