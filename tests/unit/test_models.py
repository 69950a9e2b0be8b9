"""Tier 1: the teaching models and bundled data (pure torch, no processes)."""

import pytest
import torch

from workbench.models import (
    GPT,
    MLP,
    GPTConfig,
    MoEConfig,
    MoEGPT,
    SyntheticDataset,
    TextDataset,
    batch_at,
    batches,
    build_model,
    corpus_files,
    decode,
    encode,
    load_balancing_loss,
    load_corpus,
    route,
)

TINY = GPTConfig.tiny()


def test_presets_sizes():
    assert 10_000 < TINY.num_params() < 100_000
    assert 80e6 < GPTConfig.m100().num_params() < 130e6
    assert 0.8e9 < GPTConfig.b1().num_params() < 1.3e9
    assert sum(p.numel() for p in GPT(TINY).parameters()) == TINY.num_params()
    cfg = TINY.with_(tie_embeddings=True)
    assert sum(p.numel() for p in GPT(cfg).parameters()) == cfg.num_params()


def test_config_errors():
    with pytest.raises(ValueError, match="n_kv_heads"):
        GPTConfig(dim=32, n_heads=4, n_kv_heads=3)
    with pytest.raises(ValueError, match="divisible"):
        GPTConfig(dim=30, n_heads=4)


def test_forward_shape_and_causality():
    torch.manual_seed(0)
    m = GPT(TINY)
    x = torch.randint(0, 256, (2, 16))
    out = m(x)
    assert out.shape == (2, 16, 256)
    x2 = x.clone()
    x2[:, 10:] = (x2[:, 10:] + 1) % 256  # change the future
    out2 = m(x2)
    torch.testing.assert_close(out[:, :10], out2[:, :10])
    assert not torch.allclose(out[:, 10:], out2[:, 10:])


def test_gqa_matches_repeated_kv():
    """GQA with kv heads shared equals MHA whose k/v weights repeat the shared heads."""
    torch.manual_seed(0)
    gqa = GPT(TINY)  # 4 heads, 2 kv heads
    mha = GPT(TINY.with_(n_kv_heads=4))
    sd = gqa.state_dict()
    hd = TINY.head_dim
    for k in list(sd):
        if k.endswith(("attention.wk.weight", "attention.wv.weight")):
            w = sd[k].view(2, hd, TINY.dim)
            sd[k] = w.repeat_interleave(2, dim=0).reshape(4 * hd, TINY.dim)
    mha.load_state_dict(sd)
    x = torch.randint(0, 256, (2, 8))
    torch.testing.assert_close(gqa(x), mha(x))


def test_pipeline_split_and_stages_compose():
    cfg = TINY.with_(n_layers=5)
    torch.manual_seed(0)
    full = GPT(cfg)
    assert full.pipeline_split_points(2) == [["0", "1", "2"], ["3", "4"]]
    assert full.pipeline_split_points(5) == [[str(i)] for i in range(5)]
    with pytest.raises(ValueError, match="need 1..5"):
        full.pipeline_split_points(6)
    x = torch.randint(0, 256, (2, 8))
    want = full(x)
    h = x
    for s in range(3):
        torch.manual_seed(0)
        stage = GPT(cfg).keep_stage(s, 3)
        assert (stage.tok_embeddings is None) == (s != 0) and (stage.output is None) == (s != 2)
        h = stage(h)
    torch.testing.assert_close(h, want)


def test_tp_plan_names_exist():
    m = GPT(TINY)
    names = dict(m.named_modules())
    for sp in (True, False):
        plan = m.tp_plan(sequence_parallel=sp)
        assert all(k in names for k in plan), [k for k in plan if k not in names]
    assert type(m.tp_plan()["layers.0.attention.wq"]).__name__ == "ColwiseParallel"
    assert type(m.tp_plan()["layers.1.feed_forward.w2"]).__name__ == "RowwiseParallel"
    assert type(m.tp_plan()["layers.0.attention_norm"]).__name__ == "SequenceParallel"
    assert "layers.0.attention_norm" not in m.tp_plan(sequence_parallel=False)


def test_training_reduces_loss_on_text():
    torch.manual_seed(0)
    m = GPT(TINY)
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    ds = TextDataset(TINY.max_seq_len)
    losses = []
    for x, y in batches(ds, 16, seed=0, steps=30):
        loss = torch.nn.functional.cross_entropy(m(x).flatten(0, 1), y.flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[0] > 5.0 and losses[-1] < losses[0] - 1.5


# MoE -------------------------------------------------------------------------------
def test_route_capacity_and_priority():
    probs = torch.tensor([[0.7, 0.2, 0.1], [0.6, 0.3, 0.1], [0.5, 0.1, 0.4], [0.1, 0.8, 0.1]])
    idx, gate, keep = route(probs, top_k=2, capacity=2)
    assert idx[:, 0].tolist() == [0, 0, 0, 1]
    # expert 0 takes the first two first-choices; token 2's first choice is dropped
    assert keep[:, 0].tolist() == [True, True, False, True]
    # second choices queue after all first choices: expert 1 has token 3 (first) + token 0
    assert keep[0, 1] and idx[0, 1] == 1
    torch.testing.assert_close(gate.sum(-1), torch.ones(4))


def test_load_balancing_loss_is_one_when_balanced():
    E, T = 4, 64
    probs = torch.full((T, E), 1 / E)
    idx = torch.arange(T).remainder(E)[:, None]
    assert load_balancing_loss(probs, idx, E).item() == pytest.approx(1.0)
    skew = torch.zeros(T, E)
    skew[:, 0] = 1
    assert load_balancing_loss(skew, torch.zeros(T, 1, dtype=torch.long), E).item() == pytest.approx(E)


def test_moe_gpt_forward_backward_and_aux():
    torch.manual_seed(0)
    cfg = MoEConfig.tiny()
    m = build_model(cfg)
    assert isinstance(m, MoEGPT)
    x = torch.randint(0, 256, (2, 16))
    out = m(x)
    aux = m.aux_loss()
    assert out.shape == (2, 16, 256) and aux is not None
    assert aux.item() == pytest.approx(cfg.aux_loss_coef * 2, rel=0.5)  # ~1 per layer
    (out.square().mean() + aux).backward()
    assert m.layers["0"].feed_forward.router.gate.weight.grad is not None
    assert m.layers["0"].feed_forward.w1.grad.abs().sum() > 0


def test_moe_tiny_capacity_drops():
    torch.manual_seed(0)
    m = MoEGPT(MoEConfig.tiny(capacity_factor=0.25))
    m(torch.randint(0, 256, (2, 16)))
    assert m.layers["0"].feed_forward.last_dropped > 0.3


def test_mlp():
    assert MLP(16, 32, 4)(torch.randn(5, 16)).shape == (5, 4)


# Data ------------------------------------------------------------------------------
def test_corpus_is_bundled_and_roundtrips():
    files = corpus_files()
    assert len(files) >= 4 and "README.txt" not in files
    text = load_corpus()
    assert len(text.encode()) > 30_000
    assert "Four score and seven years ago" in text and "Shall I compare thee" in text
    assert decode(encode(text)) == text
    assert decode(encode("naïve ✓")) == "naïve ✓"
    assert int(encode(text).max()) < 256


def test_text_dataset_windows():
    ds = TextDataset(8, text="abcdefghijklmnopqrstuvwxyz")
    x, y = ds[1]
    assert decode(x) == "ijklmnop" and decode(y) == "jklmnopq"
    assert len(ds) == 3
    with pytest.raises(ValueError, match="too short"):
        TextDataset(64, text="short")


@pytest.mark.parametrize("kind", ["copy", "reverse", "modadd"])
def test_synthetic_tasks(kind):
    ds = SyntheticDataset(kind, n=32, seq_len=10, seed=0)
    x, y = ds[0]
    scored = y[y != -100]
    if kind == "copy":
        assert scored.tolist() == x[:5].tolist()
    elif kind == "reverse":
        assert scored.tolist() == x[:5].flip(0).tolist()
    else:
        assert scored.tolist() == [(int(x[0]) + int(x[2])) % 97]


@pytest.mark.parametrize("dp_size", [2, 4])
def test_batches_union_over_ranks_is_the_global_batch(dp_size):
    ds = TextDataset(16)
    for step in (0, 3, len(ds) // 8 + 1):  # includes an epoch boundary
        gx, gy = batch_at(ds, 8, step, seed=7)
        parts = [batch_at(ds, 8, step, dp_rank=r, dp_size=dp_size, seed=7) for r in range(dp_size)]
        torch.testing.assert_close(torch.cat([p[0] for p in parts]), gx)
        torch.testing.assert_close(torch.cat([p[1] for p in parts]), gy)
    a = [b[0] for b in batches(ds, 8, 1, 2, seed=3, steps=3)]
    b = [b[0] for b in batches(ds, 8, 1, 2, seed=3, steps=3)]
    assert all(torch.equal(u, v) for u, v in zip(a, b))
    with pytest.raises(ValueError, match="multiple of 3"):
        batch_at(ds, 8, 0, dp_rank=0, dp_size=3)
