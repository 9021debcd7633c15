"""The floor of the front end for each route: a bare aiohttp + uvloop + orjson server that reads the JSON
body and answers what inferd's route answers, in the same shape and size (the seed's echo; one 384-float
row as OpenAI's `/v1/embeddings`, TEI's `/embed`, Cohere's `/v2/embed`, KServe v2's infer and
`/v1/inference` write it), with no batching, admission, metrics or model: what this stack costs a
request at least. `benchmarks/scenarios/s9_real_frontend.py --routes` runs it beside inferd.

    python benchmarks/floor/same_bytes.py --port 8099
"""

from __future__ import annotations

import argparse
import itertools

import numpy as np
import orjson
import uvloop
from aiohttp import web

ROW = np.random.default_rng(0).standard_normal(384).astype(np.float32)
ROW /= np.linalg.norm(ROW)
NUMPY = orjson.OPT_SERIALIZE_NUMPY


def app() -> web.Application:
    ids = itertools.count()

    async def inference(request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        text = data["input"]
        output = ROW if data.get("model") == "minilm" else f"{text}=>{'0' * 12}"
        return _json({"output": output, "request_id": f"req_{next(ids):09x}", "model": data.get("model", "batchstring"),
                      "model_version": "1", "latency_ms": 10.123})

    async def embeddings(request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        return _json({"object": "list", "data": [{"object": "embedding", "index": 0, "embedding": ROW}],
                      "model": data["model"], "usage": {"prompt_tokens": 6, "total_tokens": 6}})

    async def embed(request: web.Request) -> web.Response:
        orjson.loads(await request.read())
        return _json([ROW])

    async def cohere(request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        return _json({"id": f"req_{next(ids):09x}", "embeddings": {"float": [ROW]}, "texts": data["texts"],
                      "meta": {"api_version": {"version": "2"}, "billed_units": {"input_tokens": 6}},
                      "response_type": "embeddings_by_type"})

    async def v2_infer(request: web.Request) -> web.Response:
        data = orjson.loads(await request.read())
        return _json({"model_name": "minilm", "model_version": "1", "id": data.get("id") or f"req_{next(ids):09x}",
                      "outputs": [{"name": "output", "datatype": "FP32", "shape": [1, 384], "data": ROW}]})

    application = web.Application()
    application.router.add_post("/v1/inference", inference)
    application.router.add_post("/v1/embeddings", embeddings)
    application.router.add_post("/embed", embed)
    application.router.add_post("/v2/embed", cohere)
    application.router.add_post("/v2/models/minilm/infer", v2_infer)
    return application


def _json(payload: object) -> web.Response:
    return web.Response(body=orjson.dumps(payload, option=NUMPY), content_type="application/json")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    uvloop.install()
    web.run_app(app(), host="127.0.0.1", port=parser.parse_args().port, access_log=None, print=None)
