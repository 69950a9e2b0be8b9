"""Context parallel (``cp``) on real gloo ranks: the sequence in zig-zag shards, ring
attention built in the workbench (torch's experimental ``context_parallel`` overrides only
the CUDA SDPA kernels; see ``workbench.strategies.context_parallel``).

The workbench GPT and a tiny random-init transformers Llama under cp=2, cp=2 x dp_shard=2
cp=2 x tp=2, and cp=2 with activation checkpointing: the first step's loss and every gathered gradient equal a one-process run
of the whole batch (fp32, 1e-5), and three training steps give the same losses. The HF
batches are dicts with ``labels=input_ids`` (transformers' shift leaves the last position
unlabelled, so the cp ranks hold different numbers of labelled tokens: the loss weighting
is checked too). A length not divisible by 2 x cp is padded and matches the unpadded run.
Bad input gets one message, with the model and the ranks as they were.
"""

from __future__ import annotations

import cp_ranks as C
import pytest

from workbench.strategies import SpecError, StrategySpec

pytest.importorskip("transformers")
TOL = 1e-5


def _assert_parity(rows, cases):
    for rank, got in enumerate(rows):
        for (name, spec, *_), r in zip(cases, got):
            tag = f"{name} {spec} rank {rank}"
            assert abs(r["loss0"] - r["want0"]) <= TOL * abs(r["want0"]), (tag, r["loss0"], r["want0"])
            assert r["grad_err"] <= TOL, (tag, r["grad_worst"], r["grad_err"])
            assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(r["losses"], r["want"])), (
                tag,
                r["losses"],
                r["want"],
            )
            assert r["want"][-1] < r["want"][0]  # it trains
            assert r["degrees"]["cp"] == 2


@pytest.mark.parametrize(
    "text,world,mesh",
    [
        ("cp=2", 2, {"dp_shard": 1, "cp": 2}),
        ("cp=2", 4, {"dp_shard": 2, "cp": 2}),
        ("fsdp2 cp=2 tp=2", 4, {"dp_shard": 1, "cp": 2, "tp": 2}),
        ("hsdp cp=2", 4, {"dp_replicate": 2, "dp_shard": 1, "cp": 2}),
    ],
)
def test_cp_presets(text, world, mesh):
    m = StrategySpec.parse(text).validate(world).mesh_plan(world)
    assert dict(zip(m.dim_names, m.shape)) == mesh


@pytest.mark.parametrize(
    "text,needle",
    [
        ("ddp cp=2", "use 'fsdp2 cp=2'"),
        ("pp=2 cp=2", "not supported here"),
        ("cp=2 compile=true", "cp=2 with compile is not supported"),
        ("cp=3", "cp=3 does not divide world_size=4"),
    ],
)
def test_cp_spec_errors(text, needle):
    with pytest.raises(SpecError) as e:
        StrategySpec.parse(text).validate(4)
    assert needle in str(e.value)


def test_zigzag_shards_balance_causal_work():
    import torch

    from workbench.strategies.context_parallel import zigzag_index

    seq, cp = 16, 2
    idx = [zigzag_index(seq, cp, r) for r in range(cp)]
    assert idx[0].tolist() == [0, 1, 2, 3, 12, 13, 14, 15] and idx[1].tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert sorted(torch.cat(idx).tolist()) == list(range(seq))
    work = [int((i + 1).sum()) for i in idx]  # keys each query sees under the causal mask
    assert work[0] == work[1]


CASES2 = [("gpt", "cp=2", False), ("llama", "cp=2", True)]
CASES4 = [("gpt", "cp=2 dp_shard=2", False), ("llama", "cp=2 dp_shard=2", True), ("gpt", "fsdp2 cp=2 tp=2", False)]


def test_cp2_matches_one_rank(ranks2):
    _assert_parity(ranks2.apply(C.parities, CASES2), CASES2)


CASES_PAD = [("gpt", "cp=2", False, 18), ("llama", "cp=2", True, 17)]


def test_cp2_pads_a_length_not_divisible_by_2cp_and_matches_one_rank(ranks2):
    """18 and 17 tokens do not split into 2 x cp = 4 zig-zag chunks: padded at the end to 20
    (label -100, after every real token under the causal mask), the first step's gradients
    and three steps' losses are the unpadded one-process run's."""
    _assert_parity(ranks2.apply(C.parities, CASES_PAD), CASES_PAD)


CASES_AC = [("gpt", "cp=2 ac=full", False), ("llama", "cp=2 ac=selective", True)]


def test_cp2_with_activation_checkpointing_matches_one_rank(ranks2):
    """Blocks recompute in backward, their ring attention with them (the cp ranks send and
    receive K/V again, in the same order): gradients and losses as one process."""
    rows = ranks2.apply(C.parities, CASES_AC, keep_notes=True)
    _assert_parity(rows, CASES_AC)
    for got in rows:
        assert "activation checkpointing (full): 2/2 blocks recompute in backward" in got[0]["notes"]
        assert "activation checkpointing (selective): 1/2 blocks recompute in backward" in got[1]["notes"]


def test_cp2_with_dp_shard_and_tp_matches_one_rank(ranks4):
    _assert_parity(ranks4.apply(C.parities, CASES4), CASES4)


def test_cp_bad_input_one_message_ranks_usable(ranks2):
    rows = ranks2.apply(C.bad_inputs)
    for r in rows:
        assert r["groups"], "a refused prepare created process groups"
        for (name, spec, words), (msg, same) in zip(C.BAD, r["rows"]):
            assert msg is not None and all(w in msg for w in words), (name, spec, msg)
            assert same, f"{name} {spec}: the model changed though prepare refused"
        seq_msg, call_msg = r["steps"]
        assert "sequence length 65 (padded to 68 for 2 x cp = 4 equal zig-zag chunks)" in seq_msg, seq_msg
        assert "longer than the model's 64 positions; use a length of at most 64" in seq_msg
        assert "prepared.train_step" in call_msg and "not model(x)" in call_msg
        assert r["same"], "a refused step changed the parameters"
        assert r["after"] > 0
    assert len({tuple(m for m, _ in r["rows"]) for r in rows}) == 1


def test_cp_layout_names_the_weights_sharded_over_dp_shard_x_cp(ranks4):
    """The weights are split four ways over dp_shard x cp (row-major), and the layout says so
    per mesh dim; each rank's holds are its own quarter of the rows."""
    rows = ranks4.apply(C.layout_of, "cp=2 dp_shard=2")
    for rank, r in enumerate(rows):
        assert r["mesh"] == {"shape": [2, 2], "dim_names": ["dp_shard", "cp"]}
        placements, holds = r["layers.0.attention.wq.weight"]
        assert placements == ["Shard(0)", "Shard(0)"]
        assert holds["runs"][0] == [[16 * rank, 16 * (rank + 1)]]  # 64 rows, 16 per rank
