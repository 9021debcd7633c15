"""The fixed-shape path an image model's CUDA graphs rely on, checked on the CPU with a real (random-weight)
ViT: the shape choice, padding rows that change no real row, outputs equal to the eager forward's, and
the vision backend's use of it."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from inferd.backends.image_graphs import ImageGraphs  # noqa: E402

from ...helpers import build_tiny_vit  # noqa: E402

SIZES = (16, 32)


@pytest.fixture(scope="module")
def vit_folder(tmp_path_factory) -> str:
    return build_tiny_vit(tmp_path_factory.mktemp("vit"))


def images(n: int, size: int, seed: int = 0) -> list[np.ndarray]:
    return list(np.random.default_rng(seed).standard_normal((n, 3, size, size), dtype=np.float32))


def test_pick_is_the_smallest_batch_size_that_holds_the_batch_at_its_own_image_size():
    shaped = ImageGraphs(lambda x: x, (8, 1, 4, 2), SIZES, torch.device("cpu"), 4, graphs=True)
    assert shaped.batch_sizes == (1, 2, 4, 8) and not shaped.use_graphs  # (no CUDA: never captured)
    assert shaped.pick(3, 16) == (4, 16) and shaped.pick(8, 32) == (8, 32) and shaped.pick(1, 32) == (1, 32)
    assert shaped.pick(9, 16) is None  # more images than any captured size: eager
    assert shaped.pick(2, 24) is None  # a size not captured: eager
    with pytest.raises(ValueError):
        ImageGraphs(lambda x: x, (), SIZES, torch.device("cpu"), 4, graphs=True)


def test_padded_batches_give_each_image_the_eager_forwards_output(vit_folder):
    from inferd.backends.vision import ImageModel

    model = ImageModel("cpu", {"model_path": vit_folder, "image_sizes": list(SIZES), "graph_batch_sizes": [1, 4, 8]})
    assert model.warmup() == {"cuda_graphs": 0, "graph_capture_s": 0.0}  # the CPU: nothing captured
    for n, size in ((3, 16), (1, 32), (5, 32), (8, 16)):
        batch = images(n, size, seed=n)
        padded = model.shaped.run(batch)  # (as on CUDA, without the graph: padded to 4 or 8 rows)
        alone = [model(batch[i:i + 1])[0] for i in range(n)]  # each image alone, eagerly
        assert padded is not None and padded.shape == (n, 32)
        assert np.max(np.abs(padded - np.stack(alone))) < 1e-5
        assert np.allclose(np.linalg.norm(padded, axis=1), 1.0, atol=1e-5)  # embeddings stay normalised
    assert model.shaped.run(images(9, 16)) is None  # over the largest captured size: the caller runs it eagerly


def test_the_backend_refuses_graph_batch_sizes_that_are_not_positive_integers(vit_folder):
    from inferd.backends.vision import check_options

    for bad in ([], [0, 4], ["8"], [2.5]):
        with pytest.raises(ValueError, match="graph_batch_sizes"):
            check_options({"model_path": vit_folder, "graph_batch_sizes": bad})


def test_graphs_are_off_unless_asked_for(vit_folder, monkeypatch):
    """Their first GPU run segfaulted in a replay (benchmarks/results/gpu_real_model_h200_2026-11-27.md):
    an image model runs eagerly unless its options say `cuda_graphs = true`."""
    from inferd.backends import vision

    asked: list[bool] = []

    class Recorded(ImageGraphs):
        def __init__(self, *args, graphs: bool, **kwargs) -> None:
            asked.append(graphs)
            super().__init__(*args, graphs=graphs, **kwargs)

    monkeypatch.setattr(vision, "ImageGraphs", Recorded)
    vision.ImageModel("cpu", {"model_path": vit_folder})
    vision.ImageModel("cpu", {"model_path": vit_folder, "cuda_graphs": True})
    assert asked == [False, True]
