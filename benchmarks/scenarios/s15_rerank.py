"""S15, reranking: a MiniLM-L6-shaped cross-encoder (random weights, made on the spot; MiniLM's
tokenizer) on this machine's CPU behind `POST /v1/rerank`, against the same model called directly.

- Throughput: closed-loop clients, each call one query with 1-100 documents of 4-80 words (every
  document distinct): pairs/s served, beside the backend called directly (its own `prepare_batch` and
  forward, in this process, the server stopped) on pairs drawn the same way, grouped by length bucket
  and cut at the served mean batch size. The goal: served >= 0.8x direct.
- The tail of a small call beside big ones: one client sending 10-document calls while others send
  100-document calls, its p50 and p99, beside the same client alone.
Rounds alternate served and direct (this machine is noisy); the figures are medians. With
`--baseline-tree DIR` each round also serves from that checkout, beside this one, and the results go to
`S15_rerank_vs_baseline.{md,json}`. With `--max-batch-tokens N` each round serves this checkout twice, as
configured above and with `max_batch_tokens = N` (a batch's token budget: on a CPU, where a batch's time
grows with its pairs, it bounds how long a small call waits for the batch running), to
`S15_rerank_token_budget.{md,json}`. With `--gpu-ms N` the forward is a stand-in for a GPU's (`gpu_standin`:
the real tokenizer and batching, the forward a sleep of N ms a batch, whatever its size, as a GPU's roughly
fixed time a call): the tail of a small call measured where a batch's time does not grow with its pairs,
to the same files with `_standin` in their names.
(The issue named this S14; S13 and S14 were taken by the real-model tail and the prediction scenarios.)
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from common import REPO, inferd_server, own_option, parse_args

WORDS = ("the server gathers concurrent requests into batches and runs each batch on a device while clients "
         "wait on their connections for answers about queues latency tokens models documents queries").split()
MAX_TOKENS, EDGES, MAX_BATCH = 128, (32, 64, 128), 64
CONFIG = f"""
[server]
access_log = "off"

[[models]]
name = "rr"
backend = "{{backend}}"
max_batch_size = {MAX_BATCH}
max_wait_ms = 5
max_queue = 20000
timeout_ms = 60000
{{budget}}
[models.options]
model_path = "{{path}}"
task = "rerank"
max_tokens = {MAX_TOKENS}
bucket_edges = [{", ".join(map(str, EDGES))}]
{{gpu}}"""


def make_cross_encoder(folder: Path) -> str:
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from inferd.backends.transformer import default_model_path

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=384, num_hidden_layers=6, num_attention_heads=12,
                        intermediate_size=1536, num_labels=1)
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return str(folder)


class Texts:
    """Queries and documents, every document distinct (a counter in it)."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.n = 0

    def words(self, low: int, high: int) -> str:
        return " ".join(self.rng.choice(WORDS) for _ in range(self.rng.randint(low, high)))

    def call(self, documents: int) -> dict:
        docs = []
        for _ in range(documents):
            self.n += 1
            docs.append(f"{self.n} {self.words(4, 80)}")
        return {"model": "rr", "query": self.words(4, 12), "documents": docs}


async def closed_loop(url: str, seconds: float, clients: list[tuple[str, int | None]]) -> dict:
    """Each client (label, documents per call, None: 1-100 at random) sends calls back to back for
    `seconds`. Throughput is what the server computed within the window (its own count, read at both
    ends): calls still running at the end finish afterwards, and counting them would flatter it."""
    import aiohttp

    latencies: dict[str, list[float]] = {label: [] for label, _ in clients}
    pairs = errors = 0
    stop = time.monotonic() + seconds

    async def client(label: str, documents: int | None, seed: int, http: aiohttp.ClientSession) -> None:
        nonlocal pairs, errors
        texts = Texts(seed)
        while time.monotonic() < stop:
            body = texts.call(documents or texts.rng.randint(1, 100))
            started = time.monotonic()
            async with http.post(f"{url}/v1/rerank", json=body) as resp:
                answer = await resp.json()
            if resp.status != 200 or len(answer["results"]) != len(body["documents"]):
                errors += 1
                continue
            latencies[label].append((time.monotonic() - started) * 1000)

    async def window(http: aiohttp.ClientSession) -> None:
        nonlocal pairs
        async with http.get(f"{url}/v1/models/rr") as resp:
            before = (await resp.json())["stats"]["requests_computed"]
        await asyncio.sleep(stop - time.monotonic())
        async with http.get(f"{url}/v1/models/rr") as resp:
            pairs = (await resp.json())["stats"]["requests_computed"] - before

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as http:
        await asyncio.gather(window(http), *(client(label, n, seed, http) for seed, (label, n) in enumerate(clients)))
    out = {"pairs_per_s": round(pairs / seconds, 1), "errors": errors}
    for label, values in latencies.items():
        if values:
            values.sort()
            out[label] = {"calls": len(values), "p50_ms": round(values[len(values) // 2], 1),
                          "p99_ms": round(values[min(len(values) - 1, int(len(values) * 0.99))], 1)}
    return out


def stats(url: str) -> dict:
    with urllib.request.urlopen(f"{url}/v1/models/rr", timeout=10) as resp:
        return json.loads(resp.read())["stats"]


def served(path: str, quick: bool, tree: Path | str = REPO, max_batch_tokens: int | None = None,
           gpu_ms: float | None = None) -> dict:
    seconds = 5 if quick else 20
    budget = f"max_batch_tokens = {max_batch_tokens}" if max_batch_tokens else ""
    backend = "gpu_standin:create" if gpu_ms else "inferd.backends.transformer:create"
    config = CONFIG.format(path=path, budget=budget, backend=backend, gpu=f"gpu_ms = {gpu_ms}\n" if gpu_ms else "")
    with inferd_server(config, tree=tree) as url:
        asyncio.run(closed_loop(url, 2, [("warm", None)] * 4))
        before = stats(url)
        throughput = asyncio.run(closed_loop(url, seconds, [("mixed", None)] * 8))
        after = stats(url)
        alone = asyncio.run(closed_loop(url, seconds / 2, [("ten", 10)]))
        beside = asyncio.run(closed_loop(url, seconds, [("ten", 10)] + [("hundred", 100)] * 4))
    batches = after["batches"] - before["batches"]
    computed = after["requests_computed"] - before["requests_computed"]
    return {"pairs_per_s": throughput["pairs_per_s"], "errors": throughput["errors"] + alone["errors"] + beside["errors"],
            "mean_batch": round(computed / batches, 1) if batches else None,
            "ten_alone": alone.get("ten"), "ten_beside_hundreds": beside.get("ten"), "hundreds": beside.get("hundred")}


def direct(path: str, batch: int, quick: bool, gpu_ms: float | None = None) -> dict:
    """The backend called directly: pairs drawn as the clients draw them, prepared (tokenised) and run
    in batches of `batch` within each length bucket, as the server batches them."""
    from gpu_standin import StandInModel

    from inferd.backends.transformer import TextModel

    options = {"model_path": path, "task": "rerank", "max_tokens": MAX_TOKENS, "bucket_edges": list(EDGES)}
    model = StandInModel("cpu", {**options, "gpu_ms": gpu_ms}) if gpu_ms else TextModel("cpu", options)
    texts = Texts(99)
    pairs = []
    while len(pairs) < (400 if quick else 1200):
        call = texts.call(texts.rng.randint(1, 100))
        pairs += [(call["query"], d) for d in call["documents"]]

    def one_pass() -> float:
        started = time.perf_counter()
        by_bucket: dict[int, list] = {}
        for prepared in model.prepare_batch(pairs):
            by_bucket.setdefault(prepared.bucket, []).append(prepared.input)
        for rows in by_bucket.values():
            for i in range(0, len(rows), batch):
                model(rows[i:i + batch])
        return time.perf_counter() - started

    one_pass()  # (the shapes' first calls, as the server's warm-up and earlier load had them)
    seconds = one_pass()
    return {"pairs_per_s": round(len(pairs) / seconds, 1), "pairs": len(pairs), "batch": batch}


def write_versus(rounds: list[dict], out: Path, quick: bool, budget: int | None = None, suffix: str = "") -> None:
    """This checkout and the baseline tree (or this checkout with a token budget), round by round."""
    title = (f"### S15 with and without `max_batch_tokens = {budget}`: the same load on each, alternated" if budget
             else "### S15 against a baseline tree: the same load on each checkout, alternated")
    lines = [title, "",
             "| round | checkout | served pairs/s | served / direct | mean batch | errors | 10-doc alone p50 / p99 ms | "
             "10-doc beside 4 x 100-doc p50 / p99 ms | 100-doc p50 / p99 ms |", "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        other = f"max_batch_tokens = {budget}" if budget else "baseline"
        for label, s, ratio in (("this", r["served"], r["ratio"]), (other, r["baseline"], r["baseline"]["ratio"])):
            lines.append(f"| {i} | {label} | {s['pairs_per_s']:,.0f} | {ratio} | {s['mean_batch']} | {s['errors']} | "
                         f"{s['ten_alone']['p50_ms']} / {s['ten_alone']['p99_ms']} | "
                         f"{s['ten_beside_hundreds']['p50_ms']} / {s['ten_beside_hundreds']['p99_ms']} | "
                         f"{s['hundreds']['p50_ms']} / {s['hundreds']['p99_ms']} |")
    print("\n".join(lines))
    if not quick:
        name = ("S15_rerank_token_budget" if budget else "S15_rerank_vs_baseline") + suffix
        (out / f"{name}.json").write_text(json.dumps({"rounds": rounds}, indent=1) + "\n")
        (out / f"{name}.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    budget = int(own_option("--max-batch-tokens") or 0) or None
    gpu_ms = float(own_option("--gpu-ms") or 0) or None
    suffix = "_standin" if gpu_ms else ""
    args = parse_args(__doc__, baseline=True)
    with tempfile.TemporaryDirectory() as folder:
        path = make_cross_encoder(Path(folder))
        rounds = []
        for _ in range(1 if args.quick else 2):
            s = served(path, args.quick, gpu_ms=gpu_ms)
            d = direct(path, max(1, round(s["mean_batch"] or 1)), args.quick, gpu_ms)
            rounds.append({"served": s, "direct": d, "ratio": round(s["pairs_per_s"] / d["pairs_per_s"], 3)})
            if args.baseline_tree or budget:
                b = served(path, args.quick, args.baseline_tree or REPO, budget, gpu_ms)
                rounds[-1]["baseline"] = {**b, "ratio": round(b["pairs_per_s"] / d["pairs_per_s"], 3)}
            print(json.dumps(rounds[-1]), flush=True)
    if args.baseline_tree or budget:
        write_versus(rounds, Path(args.out_dir), args.quick, budget, suffix)
        sys.exit(0)
    median = statistics.median
    summary = {
        "served_pairs_per_s": median(r["served"]["pairs_per_s"] for r in rounds),
        "direct_pairs_per_s": median(r["direct"]["pairs_per_s"] for r in rounds),
        "served_over_direct": median(r["ratio"] for r in rounds),
        "ten_alone_p99_ms": median(r["served"]["ten_alone"]["p99_ms"] for r in rounds),
        "ten_beside_hundreds_p50_ms": median(r["served"]["ten_beside_hundreds"]["p50_ms"] for r in rounds),
        "ten_beside_hundreds_p99_ms": median(r["served"]["ten_beside_hundreds"]["p99_ms"] for r in rounds),
        "hundreds_p99_ms": median(r["served"]["hundreds"]["p99_ms"] for r in rounds),
    }
    where = f"with a stand-in for a GPU ({gpu_ms:g} ms a batch)" if gpu_ms else "on the CPU"
    lines = [f"### S15: a cross-encoder (MiniLM-L6 shape, random weights) {where} behind /v1/rerank", "",
             "| round | served pairs/s | mean batch | direct pairs/s (same batch) | served / direct | errors | "
             "10-doc call alone p50 / p99 ms | 10-doc call beside 4 x 100-doc p50 / p99 ms | 100-doc calls p50 / p99 ms |",
             "|---|---|---|---|---|---|---|---|---|"]
    for i, r in enumerate(rounds, 1):
        s, d = r["served"], r["direct"]
        lines.append(f"| {i} | {s['pairs_per_s']:,.0f} | {s['mean_batch']} | {d['pairs_per_s']:,.0f} | {r['ratio']} | "
                     f"{s['errors']} | {s['ten_alone']['p50_ms']} / {s['ten_alone']['p99_ms']} | "
                     f"{s['ten_beside_hundreds']['p50_ms']} / {s['ten_beside_hundreds']['p99_ms']} | "
                     f"{s['hundreds']['p50_ms']} / {s['hundreds']['p99_ms']} |")
    lines += ["", f"Medians: served {summary['served_pairs_per_s']:,.0f} pairs/s, direct {summary['direct_pairs_per_s']:,.0f}, "
                  f"served / direct **{summary['served_over_direct']:.3f}** (goal >= 0.8); a 10-document call's p50 / p99 "
                  f"{summary['ten_beside_hundreds_p50_ms']:.0f} / {summary['ten_beside_hundreds_p99_ms']:.0f} ms beside "
                  f"100-document calls, p99 {summary['ten_alone_p99_ms']:.0f} ms alone.", ""]
    out = Path(args.out_dir)
    if not args.quick:
        (out / f"S15_rerank{suffix}.json").write_text(json.dumps({"rounds": rounds, "summary": summary}, indent=1) + "\n")
        (out / f"S15_rerank{suffix}.md").write_text("\n".join(lines))
    print("\n".join(lines))
    sys.exit(0)
