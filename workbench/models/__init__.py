"""Small teaching models (GPT/Llama-style, MoE, MLP) and bundled data. Pure torch."""

from . import data
from .config import GPTConfig, MoEConfig
from .data import *  # noqa: F403  (the tokenizer, datasets and batcher: data.__all__)
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
    *data.__all__,
    "build_model",
]


def build_model(cfg):
    """``GPT`` for a :class:`GPTConfig`, ``MoEGPT`` for a :class:`MoEConfig`."""
    return MoEGPT(cfg) if isinstance(cfg, MoEConfig) else GPT(cfg)
