"""ModelSpec parameter counts and PlanLayout validation (pure arithmetic)."""

from __future__ import annotations

import dataclasses

import pytest

from workbench.planner import ModelSpec, PlanLayout

TINY = ModelSpec(layers=2, hidden=8, heads=2, kv_heads=1, ffn=16, vocab=10, seq_len=4)


def test_tiny_param_count_by_hand():
    # attention: q,o 8x8 each = 128; k,v 8x(1*4) each = 64 -> 192
    # gated mlp 3*8*16 = 384; norms 2*8 = 16 -> layer 592
    # embeddings untied 2*10*8 = 160; final norm 8
    p = TINY.params()
    assert p.per_layer == 592
    assert p.embedding == 160
    assert p.total == p.active == 2 * 592 + 160 + 8


def test_tied_and_plain_mlp():
    tied = ModelSpec(
        layers=1, hidden=8, heads=2, kv_heads=2, ffn=16, vocab=10, seq_len=4, tied_embeddings=True, gated_mlp=False
    )
    # attention 4*64 = 256, mlp 2*8*16 = 256, norms 16, embedding 80, final norm 8
    assert tied.params().total == 256 + 256 + 16 + 80 + 8


@pytest.mark.parametrize("size, billions", [("8b", 8.03), ("70b", 70.55), ("405b", 405.85)])
def test_llama_presets_match_model_cards(size, billions):
    assert ModelSpec.llama(size).params().total / 1e9 == pytest.approx(billions, abs=0.01)


def test_moe_total_and_active():
    p = ModelSpec.preset("mixtral-8x7b").params()
    assert p.total / 1e9 == pytest.approx(46.7, abs=0.05)
    assert p.active / 1e9 == pytest.approx(12.9, abs=0.05)


def test_unknown_model_lists_presets():
    with pytest.raises(ValueError, match="known: 8b, 70b, 405b"):
        ModelSpec.preset("13b")


def test_modelspec_is_frozen_and_keyword_only():
    with pytest.raises(TypeError):
        ModelSpec(2, 8, 2, 1, 16, 10, 4)  # positional
    with pytest.raises(dataclasses.FrozenInstanceError):
        TINY.layers = 3


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(zero_stage=4), "zero_stage=4 is out of range: use 0"),
        (dict(tp=0), "tp=0: must be an int >= 1"),
        (dict(schedule="zb"), "schedule='zb' is not one of 1f1b, gpipe, interleaved"),
        (dict(precision="int4"), "precision='int4' is not one of"),
        (dict(recompute="some"), "recompute='some' is not one of none, selective, full"),
        (dict(dp_shard=4), "for plain DDP use dp_replicate=4, dp_shard=1"),
        (dict(dp_replicate=4, zero_stage=1), "use dp_shard=4, dp_replicate=1"),
        (dict(pp=4, schedule="interleaved", microbatches=8), "needs virtual_stages >= 2"),
        (dict(pp=4, schedule="interleaved", virtual_stages=2, microbatches=6), "use microbatches=8"),
        (dict(virtual_stages=2), "only applies to schedule='interleaved'"),
        (dict(dp_replicate=6, ep=4), r"ep=4 must divide .* use ep in \[1, 2, 3, 6\]"),
    ],
)
def test_layout_validation_messages(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PlanLayout(**kwargs)


def test_layout_validation_against_model():
    llama = ModelSpec.llama("70b")
    with pytest.raises(ValueError, match=r"tp=3 does not divide heads=64.*use tp in \[1, 2, 4"):
        PlanLayout(tp=3).validate_for(llama)
    with pytest.raises(ValueError, match="pp=81 exceeds layers=80.*use pp <= 80"):
        PlanLayout(pp=81).validate_for(llama)
    with pytest.raises(ValueError, match="needs a mixture-of-experts"):
        PlanLayout(dp_shard=2, zero_stage=1, ep=2).validate_for(llama)
    mixtral = ModelSpec.preset("mixtral-8x7b")
    with pytest.raises(ValueError, match=r"ep=3 does not divide experts=8.*\[1, 2, 4, 8\]"):
        PlanLayout(dp_shard=3, zero_stage=1, ep=3).validate_for(mixtral)
    with pytest.raises(ValueError, match="cp=3 does not divide seq_len"):
        PlanLayout(cp=3).validate_for(llama)


def test_mesh_shape_and_coordinates():
    layout = PlanLayout(pp=2, dp_replicate=2, dp_shard=2, zero_stage=3, cp=2, tp=4)
    assert layout.mesh_shape() == (2, 2, 2, 2, 4)
    assert layout.mesh_dim_names() == ("pp", "dp_replicate", "dp_shard", "cp", "tp")
    assert layout.world_size == 64
    assert layout.dp == 4 and layout.shard_degree == 4 and layout.grad_sync_degree == 8
    assert layout.coordinate(0) == dict(pp=0, dp_replicate=0, dp_shard=0, cp=0, tp=0)
    assert layout.coordinate(63) == dict(pp=1, dp_replicate=1, dp_shard=1, cp=1, tp=3)
    assert layout.coordinate(37) == dict(pp=1, dp_replicate=0, dp_shard=0, cp=1, tp=1)
    assert layout.stride("tp") == 1 and layout.stride("cp") == 4 and layout.stride("pp") == 32


def test_planner_never_imports_torch():
    """The planner runs in the notebook kernel: pure arithmetic, no torch.distributed."""
    import ast
    from pathlib import Path

    import workbench.planner as planner

    for path in Path(planner.__file__).parent.glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n.split(".")[0] == "torch" for n in names), path.name
