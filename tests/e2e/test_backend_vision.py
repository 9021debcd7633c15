"""The image backend through the real server: a random-weight ViT made on the spot, images of mixed
native sizes sent as base64 (plain and data URL) to /v1/embeddings and /v1/inference, each answer
checked against transformers' own image processor and model called directly; hostile images refused
alone, with the rest served."""

from __future__ import annotations

import asyncio
import base64
import io
import os
import threading

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
PIL = pytest.importorskip("PIL")

from PIL import Image  # noqa: E402

from inferd.config import ModelConfig  # noqa: E402

from ..helpers import build_tiny_vit, infer, running_server, sim_model  # noqa: E402

SIZES = [16, 32, 48]  # the size buckets (multiples of the patch, 8)


@pytest.fixture(scope="module")
def vit(tmp_path_factory) -> str:
    return build_tiny_vit(tmp_path_factory.mktemp("vit"))


def image(width: int, height: int, seed: int, fmt: str = "PNG") -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format=fmt)
    return out.getvalue()


def b64(data: bytes, url: bool = False) -> str:
    text = base64.b64encode(data).decode()
    return f"data:image/png;base64,{text}" if url else text


def expected(path: str, data: bytes) -> np.ndarray:
    """transformers' processor (resized to the bucket an image of this size goes to) and model, directly."""
    from transformers import ViTImageProcessorPil, ViTModel

    img = Image.open(io.BytesIO(data)).convert("RGB")
    size = next((s for s in SIZES if s >= max(img.size)), SIZES[-1])
    processor = ViTImageProcessorPil.from_pretrained(path)
    pixels = processor(images=img, size={"height": size, "width": size}, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        pooled = ViTModel.from_pretrained(path).eval()(pixel_values=pixels, interpolate_pos_encoding=True).pooler_output
    return torch.nn.functional.normalize(pooled, dim=1)[0].numpy()


def vision(path: str, **options) -> ModelConfig:
    return ModelConfig(name="vit", backend="inferd.backends.vision:create", max_batch_size=4, max_wait_ms=20,
                       options={"model_path": path, "image_sizes": SIZES, **options})


async def embeddings(http, url: str, body):
    async with http.post(f"{url}/v1/embeddings", json=body) as resp:
        return resp.status, await resp.json()


async def test_images_of_mixed_sizes_are_embedded_as_the_model_called_directly(http, vit):
    images = [image(w, h, seed, fmt) for seed, (w, h, fmt) in enumerate(
        [(12, 12, "PNG"), (16, 10, "JPEG"), (30, 31, "PNG"), (32, 32, "WEBP"), (40, 47, "PNG"), (90, 60, "JPEG"),
         (8, 8, "GIF"), (48, 20, "BMP")])]
    async with running_server(vision(vit, prepare_threads=3)) as srv:  # (images decoded on three threads at once)
        one_call = embeddings(http, srv.url, {"model": "vit", "input": [{"image": b64(d, url=i % 2 == 0)}
                                                                         for i, d in enumerate(images)]})
        singles = [infer(http, srv.url, {"model": "vit", "input": {"image": b64(d)}}) for d in images]
        raw = [infer(http, srv.url, d, params={"model": "vit"}, headers={"Content-Type": "image/png"}) for d in images]
        (status, body), *answers = await asyncio.gather(one_call, *singles, *raw)
        answers, raw_answers = answers[:len(images)], answers[len(images):]
        served = srv.models["vit"]
        async with http.get(f"{srv.url}/v1/models/vit") as resp:
            described = await resp.json()
        decoding = {t.name: t.native_id for t in threading.enumerate() if t.name.startswith("inferd-prepare-vit")}
        niceness = {os.getpriority(os.PRIO_PROCESS, tid) for tid in decoding.values()}
        executing = [t.native_id for t in threading.enumerate() if t.name == "inferd-vit-0"]
        niceness |= {os.getpriority(os.PRIO_PROCESS, tid) for tid in executing}
    assert set(decoding) == {"inferd-prepare-vit-0", "inferd-prepare-vit-1", "inferd-prepare-vit-2"} and executing
    # (decoding and, on the CPU, the forward run below the loop: `prepare_nice`, `execute_nice`, 10 levels by default)
    assert niceness == {min(19, os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) + 10)}
    assert status == 200, body
    for data, item, (single_status, single, _), (raw_status, raw_body, _) in zip(
            images, body["data"], answers, raw_answers, strict=True):
        want = expected(vit, data)
        assert np.max(np.abs(np.array(item["embedding"], dtype=np.float32) - want)) < 1e-4
        assert single_status == 200 and np.max(np.abs(np.array(single["output"], dtype=np.float32) - want)) < 1e-4
        assert raw_status == 200 and np.max(np.abs(np.array(raw_body["output"], dtype=np.float32) - want)) < 1e-4
    assert served.stats.requests_computed + served.shared.collapsed == 3 * len(images)
    assert max(served.stats.batch_sizes) > 1  # batched
    assert described["inputs"] == "image" and described["batch_key"]["image_sizes"] == SIZES


async def test_hostile_images_are_refused_alone_and_the_rest_served(http, vit):
    good = image(20, 20, 1)
    bomb = io.BytesIO()
    Image.new("1", (12_000, 12_000)).save(bomb, format="PNG")  # 144 million pixels in a few kB
    truncated = image(40, 40, 2, "JPEG")[:200]
    cases = {
        "bomb": ({"image": b64(bomb.getvalue())}, 413, "max_pixels"),
        "truncated": ({"image": b64(truncated)}, 400, "truncated or corrupt"),
        "unknown format": ({"image": b64(b"%PDF-1.4 not an image at all")}, 400, "allowed format"),
        "not base64": ({"image": "***"}, 400, "base64"),
        "over the byte limit": ({"image": b64(image(120, 120, 3))}, 413, "max_image_bytes"),
        "text to an image model": ("a sentence", 400, "takes image inputs"),
        "format not allowed": ({"image": b64(image(10, 10, 4, "BMP"))}, 400, "allowed format"),
    }
    config = vision(vit, max_image_bytes=len(image(120, 120, 3)) - 1, max_pixels=40_000_000,
                    formats=["PNG", "JPEG", "WEBP"])
    async with running_server(config, sim_model("m")) as srv:
        answers = await asyncio.gather(*(infer(http, srv.url, {"model": "vit", "input": value})
                                         for value, _, _ in cases.values()),
                                       *(infer(http, srv.url, {"model": "vit", "input": {"image": b64(good)}})
                                         for _ in range(3)))
        status, body, _ = await infer(http, srv.url, {"model": "m", "input": {"image": b64(good)}})
        assert status == 400 and "takes text inputs, not image" in body["message"]
    for (name, (_, code, words)), (status, body, _) in zip(cases.items(), answers):
        assert status == code and words in body["message"], (name, status, body)
    want = expected(vit, good)
    for status, body, _ in answers[len(cases):]:
        assert status == 200 and np.max(np.abs(np.array(body["output"], dtype=np.float32) - want)) < 1e-4


_NO_MARKERS = np.random.default_rng(0).integers(0, 0xFF, 20_000, dtype=np.uint8).tobytes()


async def test_a_call_over_its_pixel_budget_is_refused_whole_before_any_image_is_decoded(http, vit):
    """Sizes come from the headers, a JPEG's read whole where 20 kB of metadata push it past the first
    16 kB; a call within the budget is served, one over it is a 413 naming `max_call_pixels`. (The
    metadata holds no 0xFF byte: random bytes held the SOF marker's two bytes by chance one run in four.)"""
    out = io.BytesIO()
    Image.fromarray(np.full((100, 100, 3), 7, dtype=np.uint8)).save(out, format="JPEG", icc_profile=_NO_MARKERS)
    late_header, square, small = out.getvalue(), image(100, 100, 1), image(50, 50, 2)
    assert late_header.find(b"\xff\xc0") > 16 << 10  # (its size, in the SOF marker, lies past the first read)
    async with running_server(vision(vit, max_call_pixels=25_000)) as srv:
        served = srv.models["vit"]
        status, body = await embeddings(http, srv.url, {"model": "vit", "input": [
            {"image": b64(d)} for d in (late_header, square, small)]})  # 22,500 pixels
        assert status == 200 and len(body["data"]) == 3, body
        prepared = served.preprocessor.items
        status, body = await embeddings(http, srv.url, {"model": "vit", "input": [
            {"image": b64(late_header, url=True)}, {"image": b64(square)}, {"image": b64(square)}]})  # 30,000
        error = body["error"]  # (the OpenAI route's shape)
        assert status == 413 and error["code"] == "PAYLOAD_TOO_LARGE" and "max_call_pixels" in error["message"], body
        assert served.preprocessor.items == prepared  # (none of it decoded)
        status, body, _ = await infer(http, srv.url, {"model": "vit", "input": {"image": b64(square)}})
        assert status == 200, body


async def test_tritonclient_sends_images_as_binary_bytes(vit):
    """The Open Inference Protocol: the image model's input tensor is `image`, its BYTES elements the
    encoded images (binary extension), answered as FP32 embeddings."""
    triton = pytest.importorskip("tritonclient.http")
    images = [image(w, h, seed) for seed, (w, h) in enumerate([(10, 14), (32, 32), (44, 30)])]
    async with running_server(vision(vit)) as srv:
        def talk():
            client = triton.InferenceServerClient(srv.url.removeprefix("http://"))
            tensor = triton.InferInput("image", [len(images)], "BYTES")
            tensor.set_data_from_numpy(np.array(images, dtype=object), binary_data=True)
            answer = client.infer("vit", [tensor]).as_numpy("output")
            meta = client.get_model_metadata("vit")
            client.close()
            return answer, meta

        answer, meta = await asyncio.to_thread(talk)
    assert meta["inputs"][0]["name"] == "image"
    assert meta["outputs"][0]["shape"] == [-1, 32]  # (the vector's length, once the model has said it)
    assert answer.dtype == np.float32 and answer.shape == (3, 32)
    for row, data in zip(answer, images, strict=True):
        assert np.max(np.abs(row - expected(vit, data))) < 1e-4


async def test_an_image_body_is_limited_by_the_image_limits_not_the_text_ones(http, vit):
    """A raw image is bytes, not characters: max_input_chars (100,000 by default) does not apply to it."""
    data = image(300, 300, 5)  # ~270 kB of noise
    assert len(data) > 100_000
    async with running_server(vision(vit)) as srv:
        status, body, _ = await infer(http, srv.url, data, params={"model": "vit"}, headers={"Content-Type": "image/png"})
    assert status == 200 and np.max(np.abs(np.array(body["output"], dtype=np.float32) - expected(vit, data))) < 1e-4


async def test_large_json_image_bodies_taken_apart_before_parsing_give_the_models_answer(http, vit):
    """Bodies over 32 KiB whose images are lifted out before orjson parses the rest, as bytes
    (`image_strings`): plain base64 and a data URL, one input, an embeddings array and the same image
    again (collapsing on: keyed by its bytes), the same vectors as the model called directly; a raw
    control character or a non-ASCII character inside an image is that input's 400, the others served."""
    from inferd.wire.image_strings import LARGE_BODY

    images = [image(300, 300, 6), image(280, 290, 7)]  # ~270 kB of noise each
    text = b64(images[1]).encode()
    broken = [b'{"model": "vit", "input": {"image": "' + text[:1000] + inside + text[1000:] + b'"}}'
              for inside in (b"\t", "é".encode())]  # a raw tab; a non-ASCII character
    async with running_server(vision(vit)) as srv:
        assert srv.models["vit"].shared.collapse  # (the default)
        single = infer(http, srv.url, {"model": "vit", "input": {"image": b64(images[0], url=True)}})
        again = infer(http, srv.url, {"model": "vit", "input": {"image": b64(images[0], url=True)}})
        array = embeddings(http, srv.url, {"model": "vit", "input": [{"image": b64(d)} for d in images]})
        bad = [infer(http, srv.url, b, headers={"Content-Type": "application/json"}) for b in broken]
        (status, body, _), (again_status, again_body, _), (array_status, array_body), *refused = await asyncio.gather(
            single, again, array, *bad)
    assert len(b64(images[0])) > LARGE_BODY
    want = expected(vit, images[0])
    for answer_status, answer in ((status, body), (again_status, again_body)):
        assert answer_status == 200 and np.max(np.abs(np.array(answer["output"], dtype=np.float32) - want)) < 1e-4
    assert array_status == 200, array_body
    for item, data in zip(array_body["data"], images, strict=True):
        assert np.max(np.abs(np.array(item["embedding"], dtype=np.float32) - expected(vit, data))) < 1e-4
    for bad_status, bad_body, _ in refused:
        assert bad_status == 400 and "base64" in bad_body["message"], bad_body


async def test_an_image_classifier_answers_its_label_and_score(http, tmp_path):
    """task = classification: a ViT classifier from a local folder, its label and score equal to
    transformers' processor and model called directly."""
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessorPil

    torch.manual_seed(3)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                       intermediate_size=64, num_labels=3, id2label={0: "cat", 1: "dog", 2: "fox"},
                       label2id={"cat": 0, "dog": 1, "fox": 2})
    ViTForImageClassification(config).save_pretrained(tmp_path)
    ViTImageProcessorPil(size={"height": 32, "width": 32}).save_pretrained(tmp_path)
    images = [image(w, h, seed) for seed, (w, h) in enumerate([(32, 32), (20, 28), (64, 40)], start=10)]
    model = ModelConfig(name="vit", backend="inferd.backends.vision:create", max_batch_size=4, max_wait_ms=20,
                        options={"model_path": str(tmp_path), "task": "classification"})
    async with running_server(model) as srv:
        answers = await asyncio.gather(*(infer(http, srv.url, {"model": "vit", "input": {"image": b64(d)}})
                                         for d in images))
    processor = ViTImageProcessorPil.from_pretrained(tmp_path)
    direct = ViTForImageClassification.from_pretrained(tmp_path).eval()
    for data, (status, body, _) in zip(images, answers, strict=True):
        pixels = processor(images=Image.open(io.BytesIO(data)).convert("RGB"), return_tensors="pt")["pixel_values"]
        with torch.no_grad():
            probabilities = torch.softmax(direct(pixel_values=pixels).logits, dim=-1)[0]
        best = int(probabilities.argmax())
        assert status == 200 and body["output"]["label"] == config.id2label[best]
        assert body["output"]["score"] == pytest.approx(float(probabilities[best]), abs=1e-5)


def test_the_two_steps_give_the_batch_functions_outputs_and_are_offered_on_a_gpu_only(vit):
    from inferd.backends import Capabilities
    from inferd.backends.vision import ImageModel

    options = {"model_path": vit, "image_sizes": SIZES}
    plain, split = ImageModel("cpu", options), ImageModel("cpu", {**options, "launch_ahead": True})
    offered = Capabilities.of(split)
    assert Capabilities.of(plain).launch is None and offered.launch is not None and offered.collect is not None
    prepared = split.prepare_batch([image(30, 31, seed) for seed in range(5)])
    first, second = [p.input for p in prepared[:3]], [p.input for p in prepared[3:]]
    ahead = offered.launch(first), offered.launch(second)  # the second launched before the first is collected
    for batch, launched in zip((first, second), ahead, strict=True):
        collected = offered.collect(launched)
        assert len(collected) == len(batch)
        assert np.max(np.abs(np.stack(collected) - np.stack(plain(batch)))) < 1e-5
