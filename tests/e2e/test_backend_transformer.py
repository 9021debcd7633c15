"""The real PyTorch backend on the CPU: all-MiniLM-L6-v2 through the server, tokenised off the event
loop in micro-batches, batched by length, answered with each input's own vector."""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import threading
import time
from collections import defaultdict

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from inferd.backends.transformer import TextModel, default_model_path  # noqa: E402
from inferd.config import ModelConfig  # noqa: E402

from .. import fakes  # noqa: E402
from ..helpers import PYTHON, ServerProcess, infer, running_server, write_config  # noqa: E402

EDGES = [8, 16, 32, 64]


def minilm(backend: str = "inferd.backends.transformer:create", **kw) -> ModelConfig:
    options = {"max_tokens": 64, "bucket_edges": EDGES, **kw.pop("options", {})}
    return ModelConfig(name="minilm", backend=backend, options=options,
                       max_batch_size=kw.pop("max_batch_size", 8), max_wait_ms=kw.pop("max_wait_ms", 30), **kw)


@pytest.fixture(scope="module")
def reference() -> TextModel:
    """The same model called directly, one input at a time."""
    return TextModel("cpu", {"max_tokens": 64, "bucket_edges": EDGES})


@pytest.fixture(autouse=True)
def _reset_test_backends():
    fakes.reset()
    yield
    fakes.build_gate.set()  # never leave a gated build waiting
    fakes.reset()


def texts() -> list[str]:
    """24 distinct texts of 3 to 62 tokens: distinct, so that collapsing folds none of them together."""
    words = "the quick brown fox jumps over a lazy dog while batching servers gather requests".split()
    return [" ".join(words[: 1 + (i * 5) % len(words)] * (1 + i % 4)) for i in range(24)]


def alone(reference: TextModel, text: str) -> np.ndarray:
    return reference([reference.tokenize(text)])[0]


async def test_server_embeddings_match_the_model_called_alone(http, reference, caplog):
    inputs = texts()
    with caplog.at_level(logging.INFO, logger="inferd.access"):
        async with running_server(minilm(), access_log_sample_rate=1.0) as srv:
            results = await asyncio.gather(
                *(infer(http, srv.url, {"input": t, "model": "minilm"}, headers={"X-Request-ID": f"e{i}"})
                  for i, t in enumerate(inputs))
            )
            b64 = await asyncio.gather(*(infer(http, srv.url, {"input": t, "model": "minilm", "encoding_format": "base64"})
                                         for t in inputs[:6]))
            served = srv.models["minilm"]
    for text, (status, body, _) in zip(inputs, results):
        assert status == 200, body
        vector = np.array(body["output"], dtype=np.float32)
        assert vector.shape == (384,)
        assert abs(np.linalg.norm(vector) - 1.0) < 1e-4
        assert np.max(np.abs(vector - alone(reference, text))) < 1e-4  # batched and padded with others, the same vector
    for text, (status, body, _) in zip(inputs, b64):
        assert status == 200, body
        vector = np.frombuffer(base64.b64decode(body["output"]), dtype="<f4")
        assert np.max(np.abs(vector - alone(reference, text))) < 1e-4
    assert max(served.stats.batch_sizes) > 1  # they really were batched
    assert served.preprocessor is not None and served.preprocessor.calls < len(inputs) + 6  # tokenised in micro-batches
    # Every batch holds one length bucket, and no more than max_batch_size inputs.
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "inferd.access"]
    lines = [line for line in lines if line["request_id"].startswith("e")]
    buckets_by_batch = defaultdict(set)
    for line in lines:
        assert line["batch_size"] <= 8
        rid = int(line["request_id"][1:])
        bucket = reference.prepare_batch([inputs[rid]])[0].bucket
        assert line["bucket"] == bucket
        buckets_by_batch[line["batch_id"]].add(bucket)
    assert len(lines) == len(inputs)
    assert all(len(b) == 1 for b in buckets_by_batch.values())
    assert len({b for s in buckets_by_batch.values() for b in s}) > 1  # inputs spanned several buckets


async def test_the_tokenizer_never_runs_on_the_event_loop(http):
    loop_thread = threading.current_thread().name
    async with running_server(minilm(backend="tests.fakes:recording")) as srv:
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t, "model": "minilm"}) for t in texts()))
    assert all(status == 200 for status, _, _ in results)
    assert fakes.tokenizer_threads, "the recording tokenizer was never called"
    assert loop_thread not in fakes.tokenizer_threads
    assert set(fakes.tokenizer_threads) == {"inferd-prepare-minilm"}


async def test_warm_up_runs_every_bucket_before_ready(http):
    async with running_server(minilm(backend="tests.fakes:gated"), wait_ready=False) as srv:
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 503
        status, body, _ = await infer(http, srv.url, {"input": "too soon", "model": "minilm"})
        assert (status, body["error"]) == (503, "NOT_READY")
        fakes.build_gate.set()
        await srv.wait_ready(60)
        worker = srv.models["minilm"].workers[0]
        backend = worker.backend
        assert backend.bucket_edges == (8, 16, 32, 64)  # the last bucket is always max_tokens
        measured = worker.measured_costs  # then each bucket timed at 1, 2, 4... inputs: the cost model's start
        assert {bucket for bucket, _, _ in measured} == {0, 1, 2, 3} and all(s > 0 for _, _, s in measured)
        assert [size for bucket, size, _ in measured if bucket == 0][:2] == [1, 2]
        assert backend.calls == 4 + len(measured)  # one warm-up batch per bucket, the measurements, nothing else yet
        async with http.get(f"{srv.url}/readyz") as resp:
            assert resp.status == 200
        async with http.get(f"{srv.url}/v1/models") as resp:
            warmup = (await resp.json())["data"][0]["warmup"]["minilm-0"]
        assert warmup["cuda_graphs"] == 0 and warmup["warmup_s"] > 0  # no graphs on the CPU; the time is reported


async def test_bad_inputs_get_a_400_and_their_batch_neighbours_are_answered(http, reference):
    good = texts()[:6]
    bad = ["word " * 100, ""]  # over max_tokens (truncation off), and empty
    async with running_server(minilm(options={"truncate": False}, max_wait_ms=50)) as srv:
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t, "model": "minilm"}) for t in [*bad, *good]))
        not_a_string = await infer(http, srv.url, {"input": ["a list"], "model": "minilm"})
    (long_status, long_body, _), (empty_status, empty_body, _) = results[:2]
    assert (long_status, long_body["error"]) == (400, "INVALID_INPUT") and "64 tokens" in long_body["message"]
    assert (empty_status, empty_body["error"]) == (400, "INVALID_INPUT") and "empty" in empty_body["message"]
    assert not_a_string[0] == 400 and not_a_string[1]["error"] == "INVALID_INPUT"
    for text, (status, body, _) in zip(good, results[2:]):
        assert status == 200, body
        assert np.max(np.abs(np.array(body["output"], dtype=np.float32) - alone(reference, text))) < 1e-4


async def test_long_inputs_are_truncated_to_max_tokens_by_default(http, reference):
    text = "word " * 100
    async with running_server(minilm()) as srv:
        status, body, _ = await infer(http, srv.url, {"input": text, "model": "minilm"})
    assert status == 200
    ids = reference.tokenize(text)
    assert len(ids) == 64 and ids[-1] == 102  # cut to max_tokens, still ending with [SEP]
    assert np.max(np.abs(np.array(body["output"], dtype=np.float32) - reference([ids])[0])) < 1e-4


async def test_another_local_model_folder_classifies(http, tmp_path):
    """A sequence-classification model from a local folder returns its label, through the same backend."""
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    torch.manual_seed(0)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                        intermediate_size=64, num_labels=2, id2label={0: "negative", 1: "positive"},
                        label2id={"negative": 0, "positive": 1})
    BertForSequenceClassification(config).save_pretrained(tmp_path)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(tmp_path)
    options = {"model_path": str(tmp_path), "task": "classification"}
    direct = TextModel("cpu", {**options, "max_tokens": 64, "bucket_edges": EDGES})
    async with running_server(minilm(options=options)) as srv:
        inputs = ["a fine day", "this is terrible", "ok"]
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t, "model": "minilm"}) for t in inputs))
    for text, (status, body, _) in zip(inputs, results):
        assert status == 200
        expected = direct([direct.tokenize(text)])[0]
        assert body["output"]["label"] == expected["label"] in ("negative", "positive")
        assert body["output"]["score"] == pytest.approx(expected["score"], abs=1e-4)


def test_classification_without_a_trained_head_is_refused_rather_than_served_at_random():
    """MiniLM is an encoder without a classification head: transformers would make one up at random."""
    with pytest.raises(ValueError, match="no trained classification head"):
        TextModel("cpu", {"task": "classification"})


async def test_a_token_budget_counts_the_tokenizers_tokens(http, reference, caplog):
    """`max_batch_tokens` with the real tokenizer's counts: long inputs go at most two to a batch."""
    long_texts = [f"{i} " + "word " * 40 for i in range(6)]  # ~43 tokens each: three are over 100
    short_texts = [f"hi {i}" for i in range(8)]  # ~4 tokens each
    with caplog.at_level(logging.INFO, logger="inferd.access"):
        async with running_server(minilm(max_batch_tokens=100, max_wait_ms=200), access_log_sample_rate=1.0) as srv:
            results = await asyncio.gather(*(infer(http, srv.url, {"input": t, "model": "minilm"})
                                             for t in [*long_texts, *short_texts]))
    for text, (status, body, _) in zip([*long_texts, *short_texts], results):
        assert status == 200, body
        assert np.max(np.abs(np.array(body["output"], dtype=np.float32) - alone(reference, text))) < 1e-4
    assert len(reference.tokenize(long_texts[0])) > 34
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "inferd.access"]
    long_bucket = EDGES.index(64)
    long_batches = {line["batch_id"]: line["batch_size"] for line in lines if line["bucket"] == long_bucket}
    assert sum(long_batches.values()) == 6 and max(long_batches.values()) <= 2, long_batches


def test_two_hugging_face_models_and_two_workers_start_together_in_a_fresh_process(tmp_path):
    """transformers imports its parts lazily, and two worker threads touching it first at once failed
    every start (`cannot import name 'AutoModel'`): only a process that has not imported it yet shows
    it, so the server runs as one."""
    config = write_config(tmp_path / "two.toml", """
[server]
access_log = "off"
[[models]]
name = "a"
backend = "inferd.backends.transformer:create"
workers = 2
[[models]]
name = "b"
backend = "inferd.backends.transformer:create"
""")
    server = ServerProcess([PYTHON, "-m", "inferd", "serve", "--config", str(config), "--port", "0"])
    try:
        server.wait_listening()
        give_up = time.monotonic() + 120
        while not any("inferd ready" in line for line in server.lines) and time.monotonic() < give_up:
            assert not any("failed to start" in line for line in server.lines), server.lines[-5:]
            time.sleep(0.1)
        assert any("inferd ready" in line for line in server.lines), server.lines[-5:]
    finally:
        assert server.stop() == 0


async def test_dimensions_cut_and_renormalise_and_teis_embed_and_client_give_the_same_vectors(http, reference):
    """MiniLM's vectors (384 wide) cut to `dimensions` on /v1/embeddings and TEI's /embed, normalised
    again, against the model called directly; what the model cannot give is a 400 naming the field."""
    inputs = texts()[:5]
    want = [alone(reference, text) for text in inputs]
    cut = [v[:128] / np.linalg.norm(v[:128]) for v in want]
    async with running_server(minilm()) as srv:
        async with http.post(f"{srv.url}/v1/embeddings", json={"input": inputs, "dimensions": 128}) as resp:
            openai_shape = await resp.json()
        async with http.post(f"{srv.url}/embed", json={"inputs": inputs, "dimensions": 128}) as resp:
            assert resp.status == 200
            tei_cut = await resp.json()
        async with http.post(f"{srv.url}/embed", json={"inputs": inputs[0], "truncate": True}) as resp:
            tei_whole = await resp.json()
        from huggingface_hub import InferenceClient  # (TEI's Python client: it posts to the server's root)

        hub = await asyncio.to_thread(InferenceClient(srv.url).feature_extraction, inputs)
        refused = {}
        for path, body in [("/v1/embeddings", {"input": "a", "dimensions": 385}),
                           ("/embed", {"inputs": "a", "dimensions": 385}),
                           ("/embed", {"inputs": "a", "normalize": False}),
                           ("/embed", {"inputs": "a", "truncate": False}),
                           ("/embed", {"inputs": "a", "truncation_direction": "Left"})]:
            async with http.post(f"{srv.url}{path}", json=body) as resp:
                answer = await resp.json()
                refused[(path, next(iter(set(body) - {"input", "inputs"})))] = (resp.status, answer)
    assert [len(d["embedding"]) for d in openai_shape["data"]] == [128] * 5
    for got, tei, expected in zip(openai_shape["data"], tei_cut, cut, strict=True):
        assert np.max(np.abs(np.array(got["embedding"]) - expected)) < 1e-4
        assert np.max(np.abs(np.array(tei) - expected)) < 1e-4
    assert len(tei_whole) == 1 and np.max(np.abs(np.array(tei_whole[0]) - want[0])) < 1e-4  # (TEI: an array even for one)
    assert hub.shape == (5, 384) and np.max(np.abs(hub - np.array(want))) < 1e-4  # (POST /: TEI's /embed)
    for (path, field), (status, answer) in refused.items():
        message = answer["error"]["message"] if path == "/v1/embeddings" else answer["message"]
        assert status == 400 and f"`{field}" in message, (path, field, answer)
    assert "up to 384" in refused[("/embed", "dimensions")][1]["message"]


async def test_compact_vector_types_and_cohere_embed_give_the_models_vectors_packed(http, reference):
    """int8, uint8, binary and ubinary on /v1/embeddings and Cohere's /v2/embed, against MiniLM called
    directly and packed here by their definitions (absmax int8, sign bits high bit first)."""
    inputs = texts()[:4]
    want = [alone(reference, text) for text in inputs]

    def int8(v: np.ndarray) -> list[int]:
        return np.rint(v * (127 / np.abs(v).max())).astype(int).tolist()

    def ubinary(v: np.ndarray) -> list[int]:
        bits = "".join("1" if x > 0 else "0" for x in v)
        return [int(bits[i:i + 8], 2) for i in range(0, len(bits), 8)]

    async with running_server(minilm()) as srv:
        openai_shape = {}
        for kind in ("int8", "uint8", "binary", "ubinary"):
            async with http.post(f"{srv.url}/v1/embeddings", json={"input": inputs, "encoding_format": kind}) as resp:
                assert resp.status == 200, await resp.text()
                openai_shape[kind] = [d["embedding"] for d in (await resp.json())["data"]]
        async with http.post(f"{srv.url}/v2/embed", json={
                "texts": inputs, "input_type": "search_document", "embedding_types": ["float", "int8", "ubinary"],
                "output_dimension": 128}) as resp:
            assert resp.status == 200, await resp.text()
            cohere = await resp.json()
        async with http.post(f"{srv.url}/v2/embed", json={"texts": inputs[:1], "truncate": "NONE"}) as resp:
            refused = (resp.status, await resp.json())
    for got, v in zip(openai_shape["int8"], want, strict=True):
        assert np.max(np.abs(np.array(got) - int8(v))) <= 1  # (a component on a rounding edge may fall either side)
    for got, v in zip(openai_shape["uint8"], want, strict=True):
        assert np.max(np.abs(np.array(got) - 128 - int8(v))) <= 1
    for got, v in zip(openai_shape["ubinary"], want, strict=True):
        assert len(got) == 48 and sum(bin(a ^ b).count("1") for a, b in zip(got, ubinary(v))) <= 2  # (signs of ~0)
    assert [[b - 128 for b in u] for u in openai_shape["ubinary"]] == openai_shape["binary"]
    cut = [v[:128] / np.linalg.norm(v[:128]) for v in want]
    assert set(cohere["embeddings"]) == {"float", "int8", "ubinary"} and cohere["texts"] == inputs
    assert cohere["response_type"] == "embeddings_by_type" and cohere["meta"]["billed_units"]["input_tokens"] > 0
    for f, i8, ub, v in zip(cohere["embeddings"]["float"], cohere["embeddings"]["int8"], cohere["embeddings"]["ubinary"],
                            cut, strict=True):
        assert np.max(np.abs(np.array(f) - v)) < 1e-4
        assert np.max(np.abs(np.array(i8) - int8(v))) <= 1 and len(ub) == 16
    assert refused[0] == 400 and "truncate" in refused[1]["message"]  # (MiniLM truncates: "NONE" cannot be honoured)


def test_the_two_steps_give_the_batch_functions_outputs_and_are_offered_on_a_gpu_only(reference):
    """`launch_ahead` (default: on a GPU): on the CPU a launch computes the whole batch, so the worker is
    offered the two steps only when asked, and they answer what one call does."""
    from inferd.backends import Capabilities

    assert Capabilities.of(reference).launch is None  # (the CPU's default: one call a batch)
    split = TextModel("cpu", {"max_tokens": 64, "bucket_edges": EDGES, "launch_ahead": True})
    offered = Capabilities.of(split)
    assert offered.launch is not None and offered.collect is not None
    first = [split.tokenize(t) for t in texts()[:5]]
    second = [split.tokenize(t) for t in texts()[5:8]]
    ahead = offered.launch(first), offered.launch(second)  # the second launched before the first is collected
    for batch, launched in zip((first, second), ahead, strict=True):
        collected = offered.collect(launched)
        assert len(collected) == len(batch)
        for vector, ids in zip(collected, batch, strict=True):
            assert np.max(np.abs(vector - reference([ids])[0])) < 1e-5


async def test_a_worker_launching_ahead_on_a_real_model_collects_in_order_and_answers_each_its_own(http, reference):
    inputs = texts()
    async with running_server(minilm(backend="tests.fakes:launching", max_batch_size=2, max_wait_ms=5)) as srv:
        results = await asyncio.gather(*(infer(http, srv.url, {"input": t, "model": "minilm"}) for t in inputs))
    for text, (status, body, _) in zip(inputs, results, strict=True):
        assert status == 200, body
        assert np.max(np.abs(np.array(body["output"], dtype=np.float32) - alone(reference, text))) < 1e-4
    launches = [n for step, n in fakes.device_steps if step == "launch"]
    collects = [n for step, n in fakes.device_steps if step == "collect"]
    assert collects == launches  # in the order launched, every one collected
    in_flight, most = 0, 0
    for step, _ in fakes.device_steps:
        in_flight += 1 if step == "launch" else -1
        most = max(most, in_flight)
    assert most == 2  # a full batch was launched behind the one computing, never more than one


async def test_tei_similarity_on_its_route_and_at_the_root_where_hugging_faces_client_posts_it(http, reference):
    source = "how do servers batch requests"
    others = ["servers gather requests into batches", "soup is warm tonight", source]
    async with running_server(minilm()) as srv:
        from huggingface_hub import InferenceClient

        hub = await asyncio.to_thread(InferenceClient(srv.url).sentence_similarity, source, others)  # (POST /)
        async with http.post(f"{srv.url}/similarity", json={"inputs": {"source_sentence": source, "sentences": others}}) as resp:
            status, routed = resp.status, await resp.json()
        async with http.post(f"{srv.url}/similarity", json={"inputs": {"source_sentence": source}}) as resp:
            refused = resp.status, await resp.json()
    want = [float(alone(reference, source) @ alone(reference, text)) for text in others]  # (unit vectors: the dot is the cosine)
    assert status == 200 and routed == pytest.approx(want, abs=1e-4) and hub == pytest.approx(want, abs=1e-4)
    assert routed[2] == pytest.approx(1.0, abs=1e-5) and routed[0] > routed[1]
    assert refused[0] == 400 and "source_sentence" in refused[1]["message"]


async def test_the_tokens_of_every_computed_input_are_counted_by_length(http, reference):
    inputs = texts()[:6]
    async with running_server(minilm()) as srv:
        async with http.post(f"{srv.url}/v1/embeddings", json={"model": "minilm", "input": inputs}) as resp:
            billed = (await resp.json())["usage"]["prompt_tokens"]
        async with http.get(f"{srv.url}/metrics") as resp:
            text = await resp.text()
    lengths = [len(reference.tokenize(t)) for t in inputs]
    assert billed == sum(lengths)
    assert f'inferd_input_tokens_sum{{model="minilm",version="1"}} {float(sum(lengths))}' in text
    assert f'inferd_input_tokens_count{{model="minilm",version="1"}} {float(len(inputs))}' in text
    at_most_16 = sum(n <= 16 for n in lengths)
    assert f'inferd_input_tokens_bucket{{le="16.0",model="minilm",version="1"}} {float(at_most_16)}' in text


async def test_a_model_serving_raw_vectors_answers_teis_normalize_false_and_normalises_what_asks(http, reference):
    """With the option `normalize = false`, MiniLM's pooled vectors as they are: TEI's `/embed` with
    `normalize: false` gets them, `/embed` by default (TEI's `normalize: true`) gets them unit length,
    and OpenAI's route gets them as the model gives them; each against the model called directly."""
    raw_model = TextModel("cpu", {"max_tokens": 64, "bucket_edges": EDGES, "normalize": False})
    inputs = texts()[:4]
    raw = [raw_model([raw_model.tokenize(text)])[0] for text in inputs]
    unit = [alone(reference, text) for text in inputs]
    assert all(abs(np.linalg.norm(v) - 1.0) > 0.01 for v in raw)  # (raw indeed: not unit length)
    async with running_server(minilm(options={"normalize": False})) as srv:
        async with http.post(f"{srv.url}/embed", json={"inputs": inputs, "normalize": False}) as resp:
            assert resp.status == 200
            tei_raw = await resp.json()
        async with http.post(f"{srv.url}/embed", json={"inputs": inputs}) as resp:
            tei_default = await resp.json()
        async with http.post(f"{srv.url}/v1/embeddings", json={"input": inputs}) as resp:
            openai_shape = await resp.json()
    for got, want in zip(tei_raw, raw, strict=True):
        assert np.max(np.abs(np.array(got) - want)) < 1e-4
    for got, want in zip(tei_default, unit, strict=True):
        assert np.max(np.abs(np.array(got) - want)) < 1e-4
    for got, want in zip(openai_shape["data"], raw, strict=True):
        assert np.max(np.abs(np.array(got["embedding"]) - want)) < 1e-4


def test_normalize_is_an_embedding_models_true_or_false():
    from inferd.backends.transformer import check_options

    check_options({"normalize": False})
    for wrong in ({"normalize": "no"}, {"normalize": False, "task": "rerank"}):
        with pytest.raises(ValueError, match="normalize"):
            check_options(wrong)


async def test_tei_embed_all_gives_each_tokens_hidden_state_and_never_shares_embeds_computation(http):
    """Each input's tokens' vectors as transformers' own model leaves them (special tokens too), with the
    same texts posted to /embed at the same moment: collapsing keeps the two apart, so each route gets
    its own kind of answer. A model without per-token vectors refuses /embed_all with a 400."""
    from transformers import AutoModel, AutoTokenizer

    tokenizer, model = AutoTokenizer.from_pretrained(default_model_path()), AutoModel.from_pretrained(default_model_path())
    inputs = [texts()[3], texts()[10], "a dog"]
    plain = ModelConfig(name="plain", backend="tests.fakes:fake_embedder", options={"latency_ms": 5})
    async with running_server(minilm(max_wait_ms=60), plain) as srv:
        async def post(path: str, body: dict) -> tuple[int, object]:
            async with http.post(f"{srv.url}{path}", json=body) as resp:
                return resp.status, await resp.json()

        every, pooled, ids = await asyncio.gather(post("/embed_all", {"inputs": inputs}), post("/embed", {"inputs": inputs}),
                                                  post("/embed_all", {"inputs": [[7592, 2088]]}))
        refused = await post("/embed_all", {"inputs": "hello", "model": "plain"})
        dimensions = await post("/embed_all", {"inputs": "hello", "dimensions": 8})
    assert every[0] == 200 and pooled[0] == 200 and ids[0] == 200, (every, pooled, ids)
    for text, matrix, vector in zip(inputs, every[1], pooled[1], strict=True):
        encoded = tokenizer(text, return_tensors="pt")
        with torch.no_grad():
            want = model(**encoded).last_hidden_state[0].numpy()
        got = np.asarray(matrix, dtype=np.float32)
        assert got.shape == want.shape == (encoded["input_ids"].shape[1], 384)
        np.testing.assert_allclose(got, want, atol=1e-4)
        mean = got.mean(axis=0)  # (the pooled vector /embed answered: the tokens' mean, unit length)
        np.testing.assert_allclose(np.asarray(vector), mean / np.linalg.norm(mean), atol=1e-5)
    with torch.no_grad():  # token ids take the model's special tokens around them, as a text does
        want = model(input_ids=torch.tensor([[101, 7592, 2088, 102]])).last_hidden_state[0].numpy()
    np.testing.assert_allclose(np.asarray(ids[1][0], dtype=np.float32), want, atol=1e-4)
    assert refused[0] == 400 and "/embed_all is not served by model plain" in refused[1]["message"], refused
    assert dimensions[0] == 400 and "`dimensions`" in dimensions[1]["message"], dimensions
