"""Small random-weight models, built locally in seconds, for every kind of model inferd serves: what the
tests load, and what a new user tries the README's examples on without a download.

    python -m inferd.backends.small_models reranker .models/tiny-reranker
    python -m inferd.backends.small_models classifier .models/tiny-classifier
    python -m inferd.backends.small_models image .models/tiny-vit
    python -m inferd.backends.small_models llama .models/tiny-llama

A text embedder needs none: MiniLM (all-MiniLM-L6-v2) ships with the package (`transformer`'s default).
Random weights give real shapes and real costs, not meaningful answers.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def build_cross_encoder(folder: str | Path, seed: int = 1) -> Path:
    """A BERT cross-encoder with one relevance output (a reranker; MiniLM's tokenizer), weights spread
    wide so that its scores differ clearly."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from .transformer import default_model_path

    folder = Path(folder)
    torch.manual_seed(seed)
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, num_labels=1, initializer_range=0.6)  # type: ignore[call-arg]  # (a PretrainedConfig kwarg its stub omits)
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return folder


def build_classifier(folder: str | Path, seed: int = 1) -> Path:
    """A BERT sequence classifier with three labels (negative, neutral, positive; MiniLM's tokenizer), for
    `task = "classification"`: `/v1/classify`, `/predict`, `/v1/inference`."""
    import torch
    from transformers import AutoTokenizer, BertConfig, BertForSequenceClassification

    from .transformer import default_model_path

    folder = Path(folder)
    torch.manual_seed(seed)
    labels = ("negative", "neutral", "positive")
    config = BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                        num_labels=3, id2label=dict(enumerate(labels)), label2id={name: i for i, name in enumerate(labels)},
                        initializer_range=0.6)  # type: ignore[call-arg]  # (PretrainedConfig kwargs its stub omits)
    BertForSequenceClassification(config).save_pretrained(folder)
    AutoTokenizer.from_pretrained(default_model_path()).save_pretrained(folder)
    return folder


def build_tiny_vit(folder: str | Path, seed: int = 0) -> Path:
    """A ViT of 32 px images (patch 8, 2 layers, width 32) and its image processor (an image embedder)."""
    import torch
    from transformers import ViTConfig, ViTImageProcessorPil, ViTModel

    folder = Path(folder)
    torch.manual_seed(seed)
    ViTModel(ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64)).save_pretrained(folder)
    ViTImageProcessorPil(size={"height": 32, "width": 32}, image_mean=[0.48, 0.45, 0.40],
                         image_std=[0.27, 0.26, 0.28]).save_pretrained(folder)
    return folder


def main(argv: list[str] | None = None) -> int:
    from .tiny_llama import build_tiny_llama

    builders = {"reranker": build_cross_encoder, "classifier": build_classifier, "image": build_tiny_vit,
                "llama": build_tiny_llama}
    parser = argparse.ArgumentParser(prog="python -m inferd.backends.small_models", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted(builders), help="reranker: a cross-encoder for /v1/rerank; classifier: a "
                        "three-label text classifier for /v1/classify; image: a "
                        "ViT for image embeddings; llama: a tiny Llama for generation (vLLM)")
    parser.add_argument("folder", help="where to write it (made if missing)")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    args = parser.parse_args(argv)
    print(builders[args.kind](args.folder, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
