"""A Hugging Face image model on PyTorch, one copy per worker, on that worker's device: an image
encoder (`embedding`: the pooled output, else the [CLS] token, L2-normalised; ViT, CLIP's vision
tower, DINOv2...) or an image classifier (`classification`: `{"label", "score"}`).

Images are decoded, checked and resized on the model's preprocessing threads, never on the event loop
(`image_inputs`: its limits, and why a call of several is checked whole first).

Compatibility of shapes: `image_sizes` are the buckets of images, as token counts are the buckets of
text. An image goes to the smallest size that holds its longer side (the largest when none does) and is
resized to that square (bilinear, as ViT's own processor resizes); the model's device then rescales and
normalises it with the model folder's `preprocessor_config.json` (mean, std), inside the forward, so the
host decodes and nothing more (an H200 run found a float32 normalisation on the preprocessing thread was
three quarters of an image's 3 ms there). A batch holds one size only, so nothing is padded
and no image is blown up past the next size; the cost of a size bucket is the upscaling of an image to
its bucket's edge (at most to the next size up) against the batches split by size. The model runs at
every size with its position embeddings interpolated (`interpolate_pos_encoding`); sizes must be
multiples of its patch size.

Options: `model_path` (required), `task`, `dtype` (float32, bfloat16, float16), `image_sizes` (default:
the model's own `image_size`), `max_image_bytes` (default 20 MiB), `max_pixels` (default 40 million),
`max_call_pixels` (default 200 million: sixteen 12-megapixel photos),
`formats` (default JPEG, PNG, WEBP, GIF, BMP), `cuda_graphs` (default true), `graph_batch_sizes` (the
batch sizes captured, default 1 to 64), `torch_threads`, `prepare_threads` (the threads decoding images
at once, default half the usable cores, 1 to 8: decoding runs outside the GIL, and one thread decoding
224 px PNGs capped an H200's ViT-small at 335 images/s), `prepare_nice` (default 10: the decoding
threads run that many nice levels below the event loop, so health checks and answers do not wait behind
decoding where cores are short; on 2 cores under a flood of 4 MB images `/healthz` p99 14.0 against 22.7
ms, as many images answered), `execute_nice` (default 10 on the CPU, 0 on a GPU: the same for the
executor thread and PyTorch's CPU threads under it once the model is built, as a forward on the CPU is
bulk work too; on a GPU that thread feeds the device and stays at the loop's priority), `launch_ahead`
(as the text model's: `device_steps`). On CUDA the forward runs as CUDA graphs
captured at warm-up for every (batch size, image size) shape (`image_graphs`), checked against the
eager forward (on any failure: eager, with the reason under `warmup`); eager on the CPU. Their first
GPU run (an H200) segfaulted in a replay, with each graph's captured input freed after capture; with
the input kept (`Graph.static_in`) the next run replayed every shape against eager and served without
a fault (benchmarks/results/gpu_real_model_h200_2026-11-27_run2.md). `cuda_graphs = false` runs eagerly.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import Prepared, backend_factory
from .device_steps import DeviceSteps, Launched, launch_ahead
from .hooks import ChecksCalls, PreparesBatches, WarmsUp, WarmsUpByBucket
from .image_graphs import DEFAULT_BATCH_SIZES, ImageGraphs
from .image_inputs import ImageInputs
from .transformer import DTYPES, check_choices, resolve_device, weights_need

_TASKS = ("embedding", "classification")
_OPTIONS = {"model_path", "task", "dtype", "image_sizes", "max_image_bytes", "max_pixels", "max_call_pixels", "formats",
            "torch_threads", "cuda_graphs", "graph_batch_sizes", "prepare_threads", "prepare_nice", "execute_nice",
            "launch_ahead"}


def check_options(options: Mapping[str, Any]) -> None:
    """What the backend refuses, found before anything is built."""
    check_choices(options, "inferd.backends.vision", _OPTIONS, _TASKS)
    path = options.get("model_path")
    if path is None or not Path(path).is_dir():
        raise ValueError(f"model_path {path!r} not found: a local image model folder (config.json, weights, "
                         "preprocessor_config.json)")
    sizes = options.get("image_sizes")
    if sizes is not None and (not sizes or any(type(s) is not int or s <= 0 for s in sizes)):
        raise ValueError("image_sizes must be a list of positive integers (square edges in pixels)")
    threads = options.get("prepare_threads")
    if threads is not None and (type(threads) is not int or threads < 1):
        raise ValueError("prepare_threads must be a positive integer")
    for name in ("prepare_nice", "execute_nice"):
        nice = options.get(name)
        if nice is not None and (type(nice) is not int or not 0 <= nice <= 19):
            raise ValueError(f"{name} must be an integer from 0 to 19 (nice levels below the event loop)")
    batch_sizes = options.get("graph_batch_sizes")
    if batch_sizes is not None and (not batch_sizes or any(type(b) is not int or b <= 0 for b in batch_sizes)):
        raise ValueError("graph_batch_sizes must be a list of positive integers")


def memory_bytes(options: Mapping[str, Any]) -> int:
    """One worker's need: its weights as stored (halved for a half-precision dtype), plus a fifth."""
    return weights_need(Path(options["model_path"]), options.get("dtype"))


class ImageModel(PreparesBatches, ChecksCalls, WarmsUp, WarmsUpByBucket):
    """One worker's image model: `prepare_batch` on the way in (decode, check, resize, normalise), then
    the batch function (pixel arrays of one size in, one output per image)."""

    input_kind = "image"

    def __init__(self, device: str, options: Mapping[str, Any]) -> None:
        check_options(options)
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from PIL import Image
        from transformers import AutoConfig, AutoModel, AutoModelForImageClassification

        self.task = options.get("task", "embedding")
        self.output_kind = self.task
        if "torch_threads" in options:
            torch.set_num_threads(int(options["torch_threads"]))
        path = Path(options["model_path"])
        self.device = resolve_device(device)
        self.dtype = DTYPES[options.get("dtype", "float32")]
        config = AutoConfig.from_pretrained(path)
        vision = getattr(config, "vision_config", config)  # (CLIP's whole config holds its vision tower's)
        self.native_size = int(vision.image_size)
        patch = int(getattr(vision, "patch_size", 1))
        self.image_sizes = tuple(sorted(set(options.get("image_sizes") or [self.native_size])))
        if any(size % patch for size in self.image_sizes):
            raise ValueError(f"image_sizes {list(self.image_sizes)} must be multiples of the model's patch size {patch}")
        self.inputs = ImageInputs(Image, self.image_sizes, {size: (size // patch) ** 2 for size in self.image_sizes},
                                  options)
        self.prepare_threads = int(options.get("prepare_threads", default_prepare_threads()))
        self.prepare_nice = int(options.get("prepare_nice", 10))
        self.prepare_max_batch = 8  # (decoding costs ms an image: a gone client's images are dropped between calls)
        processing = _preprocessing(path)
        # Rescaled and normalised on the model's device, inside the forward (and its graphs): the host
        # keeps the decoded uint8 pixels, a quarter of the float32 bytes to copy, and no per-pixel arithmetic.
        self.rescale = processing["rescale_factor"]
        self.mean = torch.tensor(processing["image_mean"], dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        self.std = torch.tensor(processing["image_std"], dtype=torch.float32, device=self.device).view(1, 3, 1, 1)
        if self.task == "embedding":
            model = AutoModel.from_pretrained(path, dtype=self.dtype)
            model = getattr(model, "vision_model", model)  # (a whole CLIP: its vision tower)
        else:
            model, loading = AutoModelForImageClassification.from_pretrained(path, dtype=self.dtype,
                                                                            output_loading_info=True)
            if loading["missing_keys"]:  # transformers would fill the head with random weights, and serve them
                raise ValueError(f"{path} has no trained classification head; task = classification needs one")
        self.model = model.to(self.device).eval()
        # A forward on the CPU is bulk work too: below the loop, as decoding is (`execute_nice`).
        self.execute_nice = int(options.get("execute_nice", 10 if self.device.type == "cpu" else 0))
        self.labels = getattr(self.model.config, "id2label", None) or {}
        self.compatibility = {"task": self.task, "dtype": options.get("dtype", "float32"), "device": str(self.device),
                              "image_sizes": list(self.image_sizes), "resize": "bilinear, to the bucket's square",
                              "mean": processing["image_mean"], "std": processing["image_std"]}
        self.calls = 0
        width = int(self.model.config.num_labels) if self.task == "classification" else int(vision.hidden_size)
        if self.task == "embedding":
            self.embedding_sizes, self.normalized = width, True  # (`dimensions`: any size up to its width)
        self.stream = torch.cuda.Stream(self.device) if self.device.type == "cuda" else None
        self.shaped = ImageGraphs(self._compute, options.get("graph_batch_sizes", DEFAULT_BATCH_SIZES), self.image_sizes,
                                  self.device, width, graphs=bool(options.get("cuda_graphs", True)), stream=self.stream)
        self.steps = DeviceSteps(self.shaped, self.device, self.stream)
        if launch_ahead(options, self.device):  # (the contract's two steps: the worker launches the next batch early)
            self.launch, self.collect = self._launch, self._collect

    # ---- on the way in (the preprocessing thread; the event loop for `check_call`) ----------------

    def prepare_batch(self, items: Sequence[Any]) -> list[Prepared | Exception]:
        """Each image decoded, checked and resized to its size bucket (`image_inputs`)."""
        return self.inputs.prepare_batch(items)

    def check_call(self, items: Sequence[Any]) -> None:
        self.inputs.check_call(items)

    # ---- warm-up (the worker thread, before the model is ready) ----------------------------------

    def warmup(self) -> dict[str, Any]:
        """Capture the CUDA graphs (a no-op on the CPU); what it did, for `GET /v1/models`."""
        return self.shaped.warmup_report()

    def warmup_batches(self) -> list[list[np.ndarray]]:
        """One batch per size bucket."""
        return [[np.zeros((size, size, 3), dtype=np.uint8)] * 2 for size in self.image_sizes]

    # ---- the batch function (the worker thread) --------------------------------------------------

    def __call__(self, batch: list[np.ndarray]) -> list[Any]:
        return self._collect(self._launch(batch))

    @torch.inference_mode()
    def _launch(self, batch: list[np.ndarray]) -> Launched:
        """The batch queued on the device, as its captured graph or eagerly (`device_steps`)."""
        self.calls += 1
        size = batch[0].shape[0]
        shape = self.shaped.pick(len(batch), size) if self.shaped.use_graphs else None
        if shape is not None:
            return self.steps.graph(batch, size, shape)
        pixels = torch.from_numpy(np.stack(batch))
        return self.steps.eager(len(batch), size, lambda: self._compute(self.steps.to_device(pixels)))

    def _collect(self, launched: Launched) -> list[Any]:
        out = self.steps.collect(launched)[0]
        if self.task == "classification":
            best = out.argmax(axis=1)
            return [{"label": self.labels.get(int(i), str(int(i))), "score": float(out[row, i])} for row, i in enumerate(best)]
        return list(out)

    def _compute(self, pixels: torch.Tensor) -> torch.Tensor:
        """(batch, s, s, 3) uint8 RGB on the device -> (batch, width) float32: the class probabilities, or
        the L2-normalised embedding (the pooled output, else [CLS]). What a CUDA graph captures. Rescaled
        and normalised in float32 (as the model folder's processor does), then cast to the model's dtype."""
        # (a contiguous NCHW copy: the permuted view would carry channels-last strides into the convolution)
        values = pixels.permute(0, 3, 1, 2).to(torch.float32, memory_format=torch.contiguous_format)
        values = (values * self.rescale - self.mean) / self.std
        out = self.model(pixel_values=values.to(self.dtype), interpolate_pos_encoding=pixels.shape[-2] != self.native_size)
        if self.task == "classification":
            return torch.softmax(out.logits.float(), dim=-1)
        pooled = getattr(out, "pooler_output", None)
        if pooled is None:
            pooled = out.last_hidden_state[:, 0]
        return torch.nn.functional.normalize(pooled.float(), p=2, dim=1)


def default_prepare_threads() -> int:
    """Half the cores this process may use, 1 to 8: the rest for the event loop, the model's executor
    thread and the HTTP work."""
    return max(1, min(8, len(os.sched_getaffinity(0)) // 2))


def _preprocessing(path: Path) -> dict[str, Any]:
    """The rescale factor, mean and std of the model folder's preprocessor_config.json (ImageNet's 0.5
    defaults, as ViT's processor has them, where it says nothing)."""
    file = path / "preprocessor_config.json"
    saved = json.loads(file.read_text()) if file.exists() else {}
    return {
        "rescale_factor": float(saved.get("rescale_factor", 1 / 255)) if saved.get("do_rescale", True) else 1.0,
        "image_mean": list(saved.get("image_mean", (0.5, 0.5, 0.5))) if saved.get("do_normalize", True) else [0.0] * 3,
        "image_std": list(saved.get("image_std", (0.5, 0.5, 0.5))) if saved.get("do_normalize", True) else [1.0] * 3,
    }


@backend_factory
def create(device: str, options: Mapping[str, Any]) -> ImageModel:
    return ImageModel(device, options)
