"""The way into a text model: texts, token ids or (query, document) pairs to exact token ids, a length
bucket and a token count per input, with the model's limits (`max_tokens`, `truncate`).

It runs on the model's preprocessing thread, never on the event loop: one call of the Rust tokeniser
for a whole micro-batch of arriving requests (it releases the GIL). Kept apart from the forward
(`transformer`) because its rules are the model's input contract: what is refused, what is cut, and
how a pair travels as one row of ids.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..messages import EveryToken
from . import Prepared


class InputTooLong(ValueError):
    """An input over `max_tokens` when truncation is off."""


class EveryTokenIds(np.ndarray):
    """The token ids of an input that asks for every token's vector (`messages.EveryToken`, TEI's
    `/embed_all`): plain ids, marked by their type, which batching and padding keep (a view, no copy)."""


class TextInputs:
    """One model's tokeniser and input rules. `pairs`: the model is a cross-encoder, each input a
    (query, document) pair; truncation is longest-first, as sentence-transformers truncates a pair."""

    def __init__(self, tokenizer: Any, max_tokens: int, truncate: bool, bucket_edges: Sequence[int], *,
                 pairs: bool = False) -> None:
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.truncate = truncate
        self.bucket_edges = tuple(bucket_edges)
        self.pairs = pairs
        tokenizer.no_padding()  # batches are padded by `collate`, and truncation is ours to decide
        tokenizer.enable_truncation(max_tokens)
        self.vocab_size = tokenizer.get_vocab_size(with_added_tokens=True)
        self._frame = _special_token_frame(tokenizer)

    def prepare_batch(self, items: Sequence[Any]) -> list[Prepared | Exception]:
        """Exact token ids, length bucket and token count per input; an Exception for an input that
        cannot be served (over the token limit, a token id out of the vocabulary, not a pair for a
        cross-encoder). Texts go through one call of the Rust tokenizer, which releases the GIL. An
        `EveryToken` input's ids come as `EveryTokenIds`."""
        if self.pairs:
            return self._prepare_pairs(items)
        asking = [i for i, item in enumerate(items) if type(item) is EveryToken]
        if asking:  # (prepared as their texts or ids are, then marked)
            marked = self.prepare_batch([item.item if type(item) is EveryToken else item for item in items])
            for i in asking:
                prepared = marked[i]
                if isinstance(prepared, Prepared):
                    marked[i] = prepared._replace(input=prepared.input.view(EveryTokenIds))
            return marked
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
                if isinstance(item, list) and all(type(t) is int for t in item):
                    results[i] = self._from_token_ids(item)
                else:
                    results[i] = ValueError("this model takes text (or token ids)")
        return results

    def _prepare_pairs(self, items: Sequence[Any]) -> list[Prepared | Exception]:
        """A cross-encoder's inputs: (query, document) pairs, tokenised together in one call. The
        document's tokens travel as negative ids (-1 - id), so a pair stays one row of ids through the
        batching, the padding and the CUDA graphs' buffers; the forward turns them back into ids and
        token types (`_compute`)."""
        results: list[Prepared | Exception] = [None] * len(items)  # type: ignore[list-item]
        pairs = []
        for i, item in enumerate(items):
            if (isinstance(item, (tuple, list)) and len(item) == 2 and all(isinstance(t, str) and t for t in item)):
                pairs.append((i, (item[0], item[1])))
            else:
                results[i] = ValueError("a rerank model takes (query, document) pairs of non-empty texts: "
                                        "POST /v1/rerank")
        if pairs:
            encodings = self.tokenizer.encode_batch_fast([p for _, p in pairs])
            for (i, _), encoding in zip(pairs, encodings, strict=True):
                if encoding.overflowing and not self.truncate:
                    results[i] = InputTooLong(f"query and document are over this model's {self.max_tokens} tokens")
                    continue
                ids = np.array(encoding.ids, dtype=np.int64)
                second = np.array(encoding.type_ids, dtype=bool)
                ids[second] = -1 - ids[second]
                results[i] = Prepared(ids, bisect_left(self.bucket_edges, len(ids)), len(ids))
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

    def tokens_of(self, texts: Sequence[str], add_special_tokens: bool) -> list[list[dict[str, Any]]]:
        """Each text's tokens as the model reads it (cut to `max_tokens`), in Text Embeddings Inference's
        shape: id, text (a special token's own; else the text's characters `start` to `stop`), special."""
        answer = []
        for text, encoding in zip(texts, self.tokenizer.encode_batch(list(texts), add_special_tokens=add_special_tokens)):
            answer.append([{"id": token_id, "text": token, "special": True, "start": None, "stop": None} if special
                           else {"id": token_id, "text": text[start:stop], "special": False, "start": start, "stop": stop}
                           for token_id, token, special, (start, stop) in zip(
                               encoding.ids, encoding.tokens, encoding.special_tokens_mask, encoding.offsets)])
        return answer

    def text_of(self, id_lists: Sequence[Sequence[int]], skip_special_tokens: bool) -> list[str]:
        """Token ids back to text, one string per list (ValueError for an id outside the vocabulary)."""
        for ids in id_lists:
            if any(not 0 <= t < self.vocab_size for t in ids):
                raise ValueError(f"token ids must be between 0 and {self.vocab_size - 1}")
        return list(self.tokenizer.decode_batch([list(ids) for ids in id_lists], skip_special_tokens=skip_special_tokens))

    def _prepared(self, ids: list[int]) -> Prepared:
        array = np.array(ids, dtype=np.int64)
        return Prepared(array, bisect_left(self.bucket_edges, len(array)), len(array))


def _special_token_frame(tokenizer: Any) -> tuple[list[int], list[int]]:
    """The special tokens the tokenizer puts before and after a single text ([CLS] and [SEP] for BERT),
    found by encoding one word with and without them."""
    inner = tokenizer.encode("a", add_special_tokens=False).ids
    whole = tokenizer.encode("a", add_special_tokens=True).ids
    for start in range(len(whole) - len(inner) + 1):
        if whole[start : start + len(inner)] == inner:
            return whole[:start], whole[start + len(inner) :]
    return [], []
