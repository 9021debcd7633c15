"""A tiny random-weight Llama and its BPE tokenizer, built locally in seconds (for tests and demos).

No model hub is reachable here, so generation is proven on a model made on the spot: random weights,
a byte-level BPE trained on a little text, and a chat template. `head_dim` is 32 (hidden 128, 4 heads),
a size vLLM's CPU attention supports.
"""

from __future__ import annotations

import argparse
from pathlib import Path

_TEXT = """The batching server gathers requests into batches and runs each batch on a GPU.
Clients send one input per request and wait on the same connection for the answer.
Continuous batching schedules every token step, so short replies do not wait for long ones.
A deadline aborts a request in the engine; a client that goes away aborts it as well.
"""


def build_tiny_llama(folder: str | Path, seed: int = 0) -> Path:
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=512, special_tokens=["<s>", "</s>", "<pad>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    bpe.train_from_iterator([_TEXT] * 20, trainer=trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    tokenizer.chat_template = (
        "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
        "{% if add_generation_prompt %}assistant: {% endif %}"
    )
    tokenizer.save_pretrained(folder)
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=tokenizer.vocab_size, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=512,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
    )
    LlamaForCausalLM(config).to(torch.float32).save_pretrained(folder)  # type: ignore[arg-type]  # (transformers' `to` stub wants a model)
    return folder


if __name__ == "__main__":  # (`small_models llama FOLDER` does the same)
    parser = argparse.ArgumentParser(prog="python -m inferd.backends.tiny_llama", description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", nargs="?", default="tiny-llama", help="where to write it (default: tiny-llama)")
    print(build_tiny_llama(parser.parse_args().folder))
