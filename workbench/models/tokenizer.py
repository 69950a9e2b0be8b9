"""A small BPE tokenizer trained on the bundled corpus, saved as a folder ``AutoTokenizer`` loads.

For fine-tuning examples that download nothing: ``tokenizers`` trains a byte-level BPE on
``workbench/models/data`` in about a second, and the folder it writes (``tokenizer.json``,
``tokenizer_config.json`` with a ChatML chat template) is what a real model's tokenizer
folder looks like to ``transformers``.
"""

from __future__ import annotations

import os

__all__ = ["CHATML", "SPECIAL_TOKENS", "train_tokenizer"]

# ChatML, as many instruction-tuned models use: every turn is <|im_start|>role\n...<|im_end|>\n
CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|pad|>", "<|im_start|>", "<|im_end|>"]


def train_tokenizer(out_dir: str, *, vocab_size: int = 512, texts: list[str] | None = None) -> str:
    """Train a byte-level BPE on ``texts`` (default: the bundled corpus) and save it to ``out_dir``."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from .data import load_corpus

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    corpus = texts if texts is not None else load_corpus().split("\n\n")
    tok.train_from_iterator(corpus, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<|pad|>", bos_token="<|im_start|>", eos_token="<|im_end|>"
    )
    fast.chat_template = CHATML
    os.makedirs(out_dir, exist_ok=True)
    fast.save_pretrained(out_dir)
    return out_dir
