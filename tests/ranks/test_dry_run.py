"""The dry run end to end: processes forked per rank position, no live ranks.

Small transformers Llama configs (64 hidden, a few layers) keep each dry run to seconds;
the catalogue layouts at full scale are benchmarks/dry_run_bench.py's. What is checked:
ranks that hold different shard shapes (a vocabulary ``dp_shard`` does not divide) get
positions of their own and every rank, built, equals its position; a layout that cannot
work ends with the strategy's own message, as ``prepare`` on a live rank gives it; the
magic's report names the collectives by mesh dimension and sets the planner beside it.
"""

from __future__ import annotations

import pytest

from workbench.shared.dry_run import DryRunError


def llama(**over):
    from transformers import LlamaConfig

    cfg = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=False,
        max_position_embeddings=64,
    )
    return LlamaConfig(**{**cfg, **over})


def test_uneven_shards_get_positions_of_their_own_and_every_rank_equals_its_position():
    from workbench.notebook.dry_run import dry_run

    # vocab 1001 over dp_shard=4: the embedding and head rows split 251, 251, 251, 248
    cfg = llama(vocab_size=1001, num_hidden_layers=3)
    grouped = dry_run(cfg, gpus=8, pp=2, dp_shard=4, seq=32, microbatches=2, precision="fp32")
    table = grouped.table()
    assert table["ranks"].tolist() == ["0-2", "3", "4-6", "7"]
    assert table["grouped_over"].tolist() == ["dp_shard", "self", "dp_shard", "self"]
    assert grouped.result.processes == 4  # a rank per stage, then the two ranks holding less
    # FSDP2 pads every shard to the same storage; the optimizer's moments are the shard's own size
    assert table["param_bytes"][0] == table["param_bytes"][1]
    assert table["optim_bytes"][1] < table["optim_bytes"][0]
    stages = grouped.stages()
    assert stages["blocks"].tolist() == [2, 1]  # the first stage takes the extra block
    every = dry_run(cfg, gpus=8, pp=2, dp_shard=4, seq=32, microbatches=2, precision="fp32", every_rank=True)
    assert every.result.processes == 8
    assert every.result.checked == {"ranks": 8, "differ": []}
    for a, b in zip(grouped.result.positions, every.result.positions):
        assert (a.ranks, a.param_bytes, a.optim_bytes, a.peak_bytes) == (
            b.ranks,
            b.param_bytes,
            b.optim_bytes,
            b.peak_bytes,
        )


def _live_message(cfg, spec: str, world: int) -> str:
    """What ``prepare``'s checks say on a live rank for this model and layout (run here)."""
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.strategies import ModelHints, PrepareError, SpecError, StrategySpec, check_layout, model_config_of

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(cfg, attn_implementation="sdpa")
    try:
        s = StrategySpec.parse(spec).validate(world, model_config_of(model))
        check_layout(model, s, world, ModelHints())
    except (SpecError, PrepareError) as exc:
        return " ".join(str(exc).split())
    raise AssertionError("the layout was accepted")


@pytest.mark.parametrize(
    "cfg_over, kwargs, spec, says",
    [
        ({}, dict(gpus=3, tp=3), "fsdp2 tp=3 dtype=bf16", "tp=3 does not divide"),
        ({}, dict(gpus=4, pp=4), "fsdp2 pp=4 dtype=bf16 schedule=1f1b mb=4", "pp=4 pipeline stages for 2 blocks"),
        ({"tie_word_embeddings": True}, dict(gpus=2, tp=2), "fsdp2 tp=2 dtype=bf16", "tie_word_embeddings=True"),
    ],
)
def test_a_layout_that_cannot_work_ends_with_the_strategys_own_message(cfg_over, kwargs, spec, says):
    from workbench.notebook.dry_run import dry_run, spec_text

    cfg = llama(**cfg_over)
    assert spec_text("fsdp2", **kwargs) == spec
    with pytest.raises(DryRunError) as info:
        dry_run(cfg, seq=32, **kwargs)
    message = str(info.value)
    assert says in message and "\n" not in message
    assert message == _live_message(cfg, spec, kwargs["gpus"])
    assert not getattr(info.value, "detail", "")  # refused before any position was forked


def test_expert_parallel_that_does_not_divide_the_experts_is_refused_as_prepare_refuses_it():
    from workbench.notebook.dry_run import dry_run

    def moe():
        from workbench.models import MoEConfig, MoEGPT

        return MoEGPT(MoEConfig.tiny())  # 4 experts

    with pytest.raises(DryRunError, match=r"ep=3 does not divide n_experts=4; use ep in \[2, 4\]"):
        dry_run(moe, gpus=6, ep=3, seq=32, precision="fp32")


def test_plan_dry_run_magic_reports_positions_collectives_and_the_planner(ipshell):
    ipshell.user_ns["make"] = lambda: llama(num_hidden_layers=4)
    report = ipshell.run_line_magic(
        "distrain", "plan --dry-run --build make --seq-len 32 --gpus 8 --tp 2 --fsdp --mbs 2"
    )
    assert report.result.world == 8 and report.result.mesh == {"shape": [4, 2], "dim_names": ["dp_shard", "tp"]}
    table = report.table()
    assert len(table) == 1 and table["ranks"][0] == "0-7" and table["grouped_over"][0] == "dp_shard x tp"
    comm = report.collectives().set_index("op")
    assert comm.loc["_allgather_base", "group"] == "dp_shard" and comm.loc["_allgather_base", "group_size"] == 4
    assert comm.loc["_reduce_scatter_base", "group"] == "dp_shard"
    assert comm.loc["all_reduce", "group"] == "tp"  # the row-parallel outputs
    cmp = report.compare().set_index("term")
    for term in ("parameters", "gradients", "optimizer", "attention", "mlp"):
        assert abs(cmp.loc[term, "ratio"] - 1) <= 0.02, cmp.loc[term]
    assert "master_params" in cmp.loc["parameters", "why"]
    fig = report.figure()
    assert {t.name for t in fig.data} >= {"dry run: parameters", "planner: activations"}
    assert "beside the planner" in report.summary()
