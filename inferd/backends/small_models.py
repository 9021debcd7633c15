"""Small random-weight models, built locally in seconds, for every kind of model inferd serves: what the
tests load, and what a new user tries the README's examples on without a download.

    python -m inferd.backends.small_models reranker .models/tiny-reranker
    python -m inferd.backends.small_models classifier .models/tiny-classifier
    python -m inferd.backends.small_models image .models/tiny-vit
    python -m inferd.backends.small_models llama .models/tiny-llama
    python -m inferd.backends.small_models lora .models/tiny-lora --base .models/tiny-llama   # (needs peft)

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


def build_lora_adapter(folder: str | Path, base: str | Path, seed: int = 1, rank: int = 8) -> Path:
    """A LoRA adapter for a causal LM (the tiny Llama: `llama`), made and saved by `peft` itself: rank `rank`
    on the attention's q and v projections, both matrices drawn wide (N(0, 0.5)) so that the adapter
    visibly changes a random model's answers (peft's default starts B at zero: an adapter that changes
    nothing). Served as `[[models.adapters]]` of the base model."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    generator = torch.Generator().manual_seed(seed)
    config = LoraConfig(r=rank, lora_alpha=2 * rank, lora_dropout=0.0, target_modules=["q_proj", "v_proj"],
                        task_type="CAUSAL_LM")
    model = get_peft_model(AutoModelForCausalLM.from_pretrained(base), config)
    with torch.no_grad():
        for name, weight in model.named_parameters():
            if "lora_A" in name or "lora_B" in name:
                weight.copy_(torch.randn(weight.shape, generator=generator) * 0.5)
    model.save_pretrained(str(folder))
    return folder


def main(argv: list[str] | None = None) -> int:
    from .tiny_llama import build_tiny_llama

    builders = {"reranker": build_cross_encoder, "classifier": build_classifier, "image": build_tiny_vit,
                "llama": build_tiny_llama}
    parser = argparse.ArgumentParser(prog="python -m inferd.backends.small_models", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("kind", choices=sorted([*builders, "lora"]), help="reranker: a cross-encoder for /v1/rerank; "
                        "classifier: a three-label text classifier for /v1/classify; image: a ViT for image embeddings; "
                        "llama: a tiny Llama for generation (vLLM); lora: a LoRA adapter for --base (made by peft)")
    parser.add_argument("folder", help="where to write it (made if missing)")
    parser.add_argument("--seed", type=int, default=0, help="the random weights' seed")
    parser.add_argument("--base", help="lora: the causal LM's folder the adapter is for (e.g. the tiny Llama)")
    args = parser.parse_args(argv)
    if args.kind == "lora":
        if not args.base:
            parser.error("lora needs --base: the folder of the model the adapter is for")
        print(build_lora_adapter(args.folder, args.base, seed=args.seed))
    else:
        print(builders[args.kind](args.folder, seed=args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
