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
    """Decoded RGB images, as `prepare_batch` hands them over: (size, size, 3) uint8."""
    return list(np.random.default_rng(seed).integers(0, 256, (n, size, size, 3), dtype=np.uint8))


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


def test_images_are_decoded_on_half_the_cores_unless_told_and_nonsense_is_refused(vit_folder, monkeypatch):
    import os

    from inferd.backends import vision

    for cores, threads in ((1, 1), (2, 1), (16, 8), (64, 8)):
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid, cores=cores: set(range(cores)))
        assert vision.default_prepare_threads() == threads
    assert vision.ImageModel("cpu", {"model_path": vit_folder, "prepare_threads": 3}).prepare_threads == 3
    for bad in (0, -1, "2", 1.5):
        with pytest.raises(ValueError, match="prepare_threads"):
            vision.check_options({"model_path": vit_folder, "prepare_threads": bad})


def test_images_are_decoded_and_computed_on_the_cpu_ten_nice_levels_below_the_loop_unless_told(vit_folder):
    from inferd.backends import vision

    default = vision.ImageModel("cpu", {"model_path": vit_folder})
    assert default.prepare_nice == default.execute_nice == 10
    told = vision.ImageModel("cpu", {"model_path": vit_folder, "prepare_nice": 0, "execute_nice": 3})
    assert (told.prepare_nice, told.execute_nice) == (0, 3)
    for name in ("prepare_nice", "execute_nice"):
        for bad in (-1, 20, "5", 2.5):
            with pytest.raises(ValueError, match=name):
                vision.check_options({"model_path": vit_folder, name: bad})


def test_graphs_are_on_unless_turned_off(vit_folder, monkeypatch):
    """Off after their first GPU run segfaulted in a replay; on again since the next run replayed every shape
    against eager and served (benchmarks/results/gpu_real_model_h200_2026-11-27_run2.md)."""
    from inferd.backends import vision

    asked: list[bool] = []

    class Recorded(ImageGraphs):
        def __init__(self, *args, graphs: bool, **kwargs) -> None:
            asked.append(graphs)
            super().__init__(*args, graphs=graphs, **kwargs)

    monkeypatch.setattr(vision, "ImageGraphs", Recorded)
    vision.ImageModel("cpu", {"model_path": vit_folder})
    vision.ImageModel("cpu", {"model_path": vit_folder, "cuda_graphs": False})
    assert asked == [True, False]


def test_prepared_images_are_the_decoded_pixels_and_the_forward_normalises_them(vit_folder):
    """The host hands over uint8 RGB; the forward's rescale and normalisation equal the model folder's
    processor (transformers' own, called directly) feeding the model."""
    import io

    from PIL import Image
    from transformers import AutoImageProcessor, AutoModel

    from inferd.backends.vision import ImageModel

    model = ImageModel("cpu", {"model_path": vit_folder, "image_sizes": [32]})
    picture = Image.fromarray(images(1, 32, seed=7)[0])
    png = io.BytesIO()
    picture.save(png, format="PNG")
    (prepared,) = model.prepare_batch([png.getvalue()])
    assert prepared.input.dtype == np.uint8 and prepared.input.shape == (32, 32, 3)
    assert np.array_equal(prepared.input, np.asarray(picture))
    processor = AutoImageProcessor.from_pretrained(vit_folder)
    pixels = processor(images=picture, return_tensors="pt", size={"height": 32, "width": 32})["pixel_values"]
    with torch.inference_mode():
        direct = AutoModel.from_pretrained(vit_folder).eval()(pixel_values=pixels).pooler_output
    direct = torch.nn.functional.normalize(direct, dim=1).numpy()
    assert np.max(np.abs(model([prepared.input])[0] - direct[0])) < 1e-5
