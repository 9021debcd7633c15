"""Text Embeddings Inference's `/tokenize` and `/decode` on the real MiniLM, each answer equal to what
transformers' own tokenizer of that model says, in TEI's shapes."""

from __future__ import annotations

import pytest

transformers = pytest.importorskip("transformers")

from inferd.backends.transformer import default_model_path  # noqa: E402
from inferd.config import ModelConfig  # noqa: E402

from ..helpers import running_server, sim_model, until  # noqa: E402

TEXTS = ["Hello, World!", "the batch was served in time"]


def minilm() -> ModelConfig:
    return ModelConfig(name="minilm", backend="inferd.backends.transformer:create", max_batch_size=8,
                       max_inputs_per_call=4, max_input_chars=200, options={"max_tokens": 32, "bucket_edges": [32]})


def expected_tokens(tokenizer, text: str, special: bool) -> list[dict]:
    encoded = tokenizer(text, add_special_tokens=special, return_offsets_mapping=True, return_special_tokens_mask=True)
    tokens = tokenizer.convert_ids_to_tokens(encoded["input_ids"])
    return [{"id": i, "text": token, "special": True, "start": None, "stop": None} if is_special else
            {"id": i, "text": text[start:stop], "special": False, "start": start, "stop": stop}
            for i, token, is_special, (start, stop) in zip(encoded["input_ids"], tokens, encoded["special_tokens_mask"],
                                                           encoded["offset_mapping"])]


async def test_tokenize_and_decode_answer_as_the_models_own_tokenizer(http):
    tokenizer = transformers.AutoTokenizer.from_pretrained(default_model_path())
    async with running_server(sim_model("seed"), minilm()) as srv:  # (the default model has no tokeniser: the first that has)
        async with http.post(f"{srv.url}/tokenize", json={"inputs": TEXTS[0]}) as resp:
            one = await resp.json()
        assert resp.status == 200 and one == [expected_tokens(tokenizer, TEXTS[0], True)]
        assert one[0][0]["text"] == "[CLS]" and one[0][1]["text"] == "Hello"  # (the text's own characters, not "hello")
        async with http.post(f"{srv.url}/tokenize", json={"inputs": TEXTS, "add_special_tokens": False,
                                                          "model": "minilm"}) as resp:
            both = await resp.json()
        assert both == [expected_tokens(tokenizer, text, False) for text in TEXTS]
        ids = [token["id"] for token in one[0]]
        async with http.post(f"{srv.url}/decode", json={"ids": ids}) as resp:
            assert resp.status == 200 and await resp.json() == [tokenizer.decode(ids, skip_special_tokens=True)]
        lists = [[t["id"] for t in tokens] for tokens in both]
        async with http.post(f"{srv.url}/decode", json={"ids": [ids, *lists], "skip_special_tokens": False}) as resp:
            decoded = await resp.json()
        assert decoded == [tokenizer.decode(i, skip_special_tokens=False) for i in (ids, *lists)]
        assert decoded[0] == "[CLS] hello, world! [SEP]"


REFUSED = [
    ("/tokenize", {"inputs": 5}, "`inputs`"),
    ("/tokenize", {"inputs": []}, "`inputs`"),
    ("/tokenize", {"inputs": ["a"] * 5}, "at most 4"),
    ("/tokenize", {"inputs": "x" * 201}, "at most 200"),
    ("/tokenize", {"inputs": "a", "prompt_name": "query"}, "prompt_name"),
    ("/tokenize", {"inputs": "a", "add_special_tokens": "yes"}, "add_special_tokens"),
    ("/tokenize", {"inputs": "a", "model": "seed"}, "no tokeniser"),
    ("/decode", {"ids": [10**9]}, "between 0 and"),
    ("/decode", {"ids": [-1]}, "between 0 and"),
    ("/decode", {"ids": [1, [2]]}, "`ids`"),
    ("/decode", {"ids": []}, "`ids`"),
    ("/decode", {"ids": [1], "skip_special_tokens": 1}, "skip_special_tokens"),
]


async def test_what_the_tokeniser_routes_cannot_take_is_a_400_naming_it(http):
    async with running_server(minilm(), sim_model("seed")) as srv:
        for path, body, says in REFUSED:
            async with http.post(f"{srv.url}{path}", json=body) as resp:
                answer = await resp.json()
            assert resp.status == 400 and answer["error"] == "INVALID_INPUT" and says in answer["message"], (body, answer)
        async with http.post(f"{srv.url}/decode", json={"ids": [1], "model": "nope"}) as resp:
            assert resp.status == 404 and (await resp.json())["error"] == "MODEL_NOT_FOUND"


async def test_without_a_model_named_a_model_still_loading_answers_503_not_the_defaults_400(http):
    loading = sim_model("later", backend="tests.fakes:switchable", options={"startup_delay_ms": 3000})
    async with running_server(sim_model("seed"), loading, wait_ready=False) as srv:
        await until(lambda: srv.models["seed"].ready)
        async with http.post(f"{srv.url}/tokenize", json={"inputs": "a"}) as resp:
            answer = await resp.json()
        assert resp.status == 503 and answer["error"] == "NOT_READY" and "later" in answer["message"], answer


async def test_the_tokeniser_routes_are_under_the_callers_rate_limit_and_a_bound_of_their_own(http):
    from inferd.config import AuthConfig, TierConfig

    free = TierConfig("free", rate_per_s=1.0, burst=1.0)
    async with running_server(minilm(), tiers=(free,), auth=AuthConfig(enabled=True, anonymous_tier="free")) as srv:
        async with http.post(f"{srv.url}/tokenize", json={"inputs": "first"}) as resp:
            assert resp.status == 200
        async with http.post(f"{srv.url}/tokenize", json={"inputs": "second, at once"}) as resp:
            answer = await resp.json()  # (as a second embeddings request would be: over the free tier's 1 a second)
        assert resp.status == 429 and answer["error"] == "RATE_LIMITED", answer
        tokens = srv.api.routes["/tokenize"].handler.__self__  # type: ignore[union-attr]
        tokens.running = 2  # (two calls on their threads: as many as run at once)
        async with http.post(f"{srv.url}/decode", json={"ids": [101, 102]}) as resp:
            answer = await resp.json()
        assert resp.status == 503 and answer["error"] == "SERVICE_OVERLOADED" and answer["retry_after_ms"] > 0, answer
        tokens.running = 0
