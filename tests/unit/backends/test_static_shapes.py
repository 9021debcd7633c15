"""The fixed-shape path the CUDA graphs rely on, checked on the CPU: shape choice, padding, masks, and
outputs equal to the eager forward's."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from inferd.backends.static_shapes import ShapedForward, ShapeGrid, collate  # noqa: E402


def test_pick_is_the_smallest_shape_that_holds_the_batch():
    grid = ShapeGrid((8, 1, 4, 2), (32, 16))  # given unsorted: sorted on the way in
    assert grid.batch_sizes == (1, 2, 4, 8)
    assert grid.pick(1, 1) == (1, 16)
    assert grid.pick(3, 16) == (4, 16)
    assert grid.pick(3, 17) == (4, 32)
    assert grid.pick(8, 32) == (8, 32)
    assert grid.pick(9, 4) is None  # more rows than any shape: eager
    assert grid.pick(2, 33) is None  # longer than any shape: eager
    assert grid.shapes()[0] == (8, 32) and grid.shapes()[-1] == (1, 16)
    assert grid.max_elements == 8 * 32


def test_collate_pads_rows_and_adds_padding_rows_that_attend_to_one_position():
    rows = [np.array([5, 6, 7]), np.array([8]), np.array([9, 10])]
    ids = np.full((4, 5), -1, dtype=np.int64)
    mask = np.full((4, 5), -1, dtype=np.int64)
    collate(rows, ids, mask, pad_id=0)
    assert ids.tolist() == [[5, 6, 7, 0, 0], [8, 0, 0, 0, 0], [9, 10, 0, 0, 0], [0, 0, 0, 0, 0]]
    assert mask.tolist() == [[1, 1, 1, 0, 0], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 0, 0, 0]]


def _toy_encoder():
    """A small attention encoder with mean pooling: what padding or a wrong mask would change."""
    torch.manual_seed(0)
    embed = torch.nn.Embedding(50, 16)
    attention = torch.nn.MultiheadAttention(16, 2, batch_first=True)

    @torch.inference_mode()
    def compute(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        x = embed(ids)
        out, _ = attention(x, x, x, key_padding_mask=mask == 0)
        weights = mask.unsqueeze(-1).float()
        return (out * weights).sum(1) / weights.sum(1)

    return compute


@pytest.mark.parametrize("lengths", [[3], [1, 4, 2], [5, 5, 5, 5], [2, 1]])
def test_fixed_shapes_give_the_eager_outputs(lengths):
    compute = _toy_encoder()
    forward = ShapedForward(compute, ShapeGrid((1, 2, 4), (4, 8)), torch.device("cpu"), width=16, pad_id=0, graphs=False)
    rng = np.random.default_rng(1)
    rows = [rng.integers(1, 50, size=n, dtype=np.int64) for n in lengths]
    fixed = forward.run(rows)
    assert fixed.shape == (len(rows), 16)
    for row, vector in zip(rows, fixed):
        alone = compute(torch.from_numpy(row[None, :]), torch.ones((1, len(row)), dtype=torch.long))[0].numpy()
        assert np.max(np.abs(vector - alone)) < 1e-5  # padded rows and padded positions change nothing


def test_batches_outside_the_grid_are_left_to_the_eager_path():
    forward = ShapedForward(_toy_encoder(), ShapeGrid((1, 2), (4,)), torch.device("cpu"), width=16, pad_id=0, graphs=False)
    assert forward.run([np.arange(1, 6)]) is None  # 5 tokens: longer than every shape
    assert forward.run([np.arange(1, 3)] * 3) is None  # 3 rows: more than every shape
    assert forward.capture() == 0.0 and forward.graphs == 0  # no graphs without CUDA


def test_graph_lengths_between_the_bucket_edges_pad_less_and_answer_the_same():
    """`graph_lengths` (a GPU run found a 256-token graph slower than eager for ~190-token inputs): the
    grid gets the lengths given plus `max_tokens`; a batch runs at the smallest that holds its longest
    input, with the eager forward's outputs (the padded path, as the graphs run it, checked on the CPU)."""
    pytest.importorskip("transformers")
    from inferd.backends.transformer import TextModel, check_options

    model = TextModel("cpu", {"max_tokens": 64, "bucket_edges": [16, 32], "graph_lengths": [24, 48]})
    assert model.shaped.grid.seq_lens == (24, 48, 64) and model.bucket_edges == (16, 32, 64)
    assert TextModel("cpu", {"max_tokens": 64, "bucket_edges": [16, 32]}).shaped.grid.seq_lens == (16, 32, 64)
    rows = [p.input for p in model.prepare_batch(["a short one", "a somewhat longer input " * 6, "three"])]
    longest = max(len(r) for r in rows)
    assert 24 < longest <= 48 and model.shaped.grid.pick(len(rows), longest)[1] == 48
    padded = model.shaped.run(rows)
    assert np.max(np.abs(padded - np.stack(model(rows)))) < 1e-5  # (the batch function: eager on the CPU)
    for bad in ([], [0], [65], ["32"]):
        with pytest.raises(ValueError, match="graph_lengths"):
            check_options({"max_tokens": 64, "graph_lengths": bad})
