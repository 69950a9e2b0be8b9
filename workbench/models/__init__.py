"""Small teaching models (GPT/Llama-style, MoE, MLP) and bundled data. Pure torch."""

from .config import GPTConfig, MoEConfig
from .data import (
    IGNORE_INDEX,
    SyntheticDataset,
    TextDataset,
    batch_at,
    batches,
    corpus_files,
    decode,
    encode,
    load_corpus,
)
from .gpt import GPT, Attention, Block, FeedForward, RMSNorm
from .mlp import MLP
from .moe import MoE, MoEGPT, expert_parallel, load_balancing_loss, route

__all__ = [
    "GPTConfig",
    "MoEConfig",
    "GPT",
    "MoEGPT",
    "MLP",
    "MoE",
    "Attention",
    "Block",
    "FeedForward",
    "RMSNorm",
    "expert_parallel",
    "load_balancing_loss",
    "route",
    "encode",
    "decode",
    "load_corpus",
    "corpus_files",
    "TextDataset",
    "SyntheticDataset",
    "batch_at",
    "batches",
    "IGNORE_INDEX",
    "build_model",
]


def build_model(cfg):
    """``GPT`` for a :class:`GPTConfig`, ``MoEGPT`` for a :class:`MoEConfig`."""
    return MoEGPT(cfg) if isinstance(cfg, MoEConfig) else GPT(cfg)
