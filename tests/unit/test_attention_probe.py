"""The attention probe the live census runs: which kernel a model really executes."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from workbench.engine.attention_probe import AttentionProbe, hf_attention_implementation


def _qkv():
    torch.manual_seed(0)
    return [torch.randn(2, 4, 16, 8, requires_grad=True) for _ in range(3)]


def test_sdpa_is_a_fused_kernel():
    q, k, v = _qkv()
    with AttentionProbe() as probe:
        F.scaled_dot_product_attention(q, k, v, is_causal=True).sum().backward()
    assert probe.kernel() == "flash"
    assert "_scaled_dot_product_flash_attention" in probe.evidence()


def test_softmax_of_the_score_matrix_is_eager():
    q, k, v = _qkv()
    with AttentionProbe() as probe:
        scores = (q @ k.transpose(-1, -2) / 8**0.5).softmax(-1)
        (scores @ v).sum().backward()
    assert probe.kernel() == "eager"
    assert "_softmax over s x s scores x1" in probe.evidence()


def test_other_softmaxes_and_no_attention_are_not_counted():
    with AttentionProbe() as probe:
        torch.randn(3, 10).softmax(-1)  # a classifier's softmax: 2-D
        torch.randn(2, 4, 16, 1).softmax(-1)  # 4-D but not a score matrix
    assert probe.kernel() is None and probe.evidence() == "no attention op seen"


def test_the_workbench_gpt_runs_sdpa():
    from workbench.models import GPT, GPTConfig

    model = GPT(GPTConfig.tiny(dim=32, n_layers=1, n_heads=2, n_kv_heads=2, ffn_dim=64, max_seq_len=16))
    x = torch.randint(0, 32, (2, 16))
    with AttentionProbe() as probe:
        model(x).float().sum().backward()
    assert probe.kernel() == "flash"
    assert hf_attention_implementation(model) is None


def test_hf_config_attn_implementation_is_read():
    class Config:
        _attn_implementation = "eager"

    class Model(torch.nn.Module):
        config = Config()

    assert hf_attention_implementation(Model()) == "eager"
