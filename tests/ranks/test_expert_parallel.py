"""Expert parallel through ``prepare`` (``ep=N``) on real gloo ranks.

``ep`` borrows ranks from ``dp_shard`` (torchtitan): the mesh is ``dp_shard_mod_ep x ep``;
each MoE layer's experts are split over ``ep`` and FSDP2-sharded over ``dp_shard_mod_ep``,
everything else FSDP2-sharded over the whole ``dp_shard``. Checked here: the first step's
gathered gradients and three steps' losses equal one process (fp32, 1e-5) on 2 ranks
(``ep=2``) and on 4 (``ep=2`` x ``dp_shard_mod_ep=2``); with capacity dropping and the
auxiliary loss on, ``ep=2`` trains exactly as ``fsdp2`` without ep; each rank holds the
experts the layout says; the spec errors and a model without experts are refused with one
message, the model as it was and the next prepare working; ``%distrain prepare ep=2`` does
the same through the magic.
"""

from __future__ import annotations

import ep_ranks as E
import pytest

from workbench.strategies import SpecError, StrategySpec

TOL = 1e-5


@pytest.mark.parametrize(
    "text,world,mesh",
    [
        ("ep=2", 2, {"dp_shard_mod_ep": 1, "ep": 2}),
        ("fsdp2 ep=2", 4, {"dp_shard_mod_ep": 2, "ep": 2}),
        ("ep=4", 4, {"dp_shard_mod_ep": 1, "ep": 4}),
    ],
)
def test_ep_borrows_dp_shard(text, world, mesh):
    s = StrategySpec.parse(text).validate(world)
    assert s.kind == "fsdp2" and s.dp_shard == world and s.ep == mesh["ep"]
    m = s.mesh_plan(world)
    assert dict(zip(m.dim_names, m.shape)) == mesh


@pytest.mark.parametrize(
    "text,needle",
    [
        ("ddp ep=2", "use 'ep=2' or 'fsdp2 ep=2'"),
        ("ep=2 tp=2", "ep=2 with tp=2 is not supported here"),
        ("hsdp ep=2", "ep=2 with dp_replicate=2"),
        ("ep=2 ac=full", "ep=2 with activation_checkpointing='full'"),
        ("ep=3", "ep=3 must divide dp_shard x cp = 4"),
    ],
)
def test_ep_spec_errors(text, needle):
    with pytest.raises(SpecError) as e:
        StrategySpec.parse(text).validate(4)
    assert needle in str(e.value)


def test_ep_config_checks():
    from workbench.models import GPTConfig, MoEConfig

    with pytest.raises(SpecError, match="GPTConfig has no experts: use ep=1"):
        StrategySpec.parse("ep=2").validate(2, GPTConfig.tiny())
    with pytest.raises(SpecError, match=r"ep=4 does not divide n_experts=6; use ep in \[2, 3, 6\]"):
        StrategySpec.parse("ep=4").validate(4, MoEConfig.tiny(n_experts=6))


def _assert_exact(rows, world):
    for rank, r in enumerate(rows):
        assert r["grad_err"] <= TOL, (rank, r["grad_worst"], r["grad_err"])
        assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(r["losses"], r["want"])), (rank, r["losses"], r["want"])
        assert r["want"][-1] < r["want"][0]
        assert r["dp"] == (rank, world)
        assert any("expert parallel over ep=2" in n for n in r["notes"])


def test_ep2_on_two_ranks_matches_one_process(ranks2):
    rows = ranks2.apply(E.run, "ep=2")
    _assert_exact(rows, 2)
    for rank, r in enumerate(rows):
        assert r["mesh"] == {"shape": [1, 2], "dim_names": ["dp_shard_mod_ep", "ep"]}
        assert r["w1_local"] == (2, 32, 64)  # 4 experts, 2 per rank
        assert r["w1_holds"] == [[2 * rank, 2 * rank + 2]]
        assert r["w1_placements"][1] == "Shard(0)"  # over ep


def test_ep2_with_dropping_and_aux_loss_trains_as_fsdp2(ranks2):
    ep, fsdp = (ranks2.apply(E.run, spec, exact=False) for spec in ("ep=2", "fsdp2"))
    for a, b in zip(ep, fsdp):
        assert all(abs(x - y) <= TOL * abs(y) for x, y in zip(a["losses"], b["losses"])), (a["losses"], b["losses"])
    assert fsdp[0]["w1_local"] == (2, 32, 64) and ep[0]["w1_local"] == (2, 32, 64)
    assert fsdp[0]["w1_holds"] == [[0, 2]] and fsdp[1]["w1_holds"] == [[2, 4]]


def test_ep2_x_dp_shard2_on_four_ranks_matches_one_process(ranks4):
    rows = ranks4.apply(E.run, "ep=2")
    _assert_exact(rows, 4)
    # rank = dp_shard_mod_ep * 2 + ep: ep rank j holds experts 2j, 2j+1; FSDP2 splits them over dp_shard_mod_ep
    assert [r["w1_holds"] for r in rows] == [[[0, 1]], [[2, 3]], [[1, 2]], [[3, 4]]]
    assert all(r["w1_local"] == (1, 32, 64) for r in rows)


def test_ep_on_a_model_without_experts_is_refused_and_ranks_usable(ranks2):
    rows = ranks2.apply(E.bad_inputs)
    for r in rows:
        (no_experts, same1), (split, same2) = r["refused"]
        assert no_experts.startswith("ep=2: BlocksNet has no experts (no workbench.models.MoE layer)"), no_experts
        assert "Use ep=1" in no_experts and same1
        assert "already split by workbench.models.expert_parallel()" in split and same2
        assert r["after"] > 0


MOE_BUILD = (
    "%%distrain\nimport torch\nfrom workbench.models import GPT, GPTConfig, MoEConfig, MoEGPT\ntorch.manual_seed(0)\n"
    "model = MoEGPT(MoEConfig.tiny())\n"
    "optimizer = lambda ps: torch.optim.AdamW(ps, lr=1e-2)\n"
)


def _clean_rank() -> bool:
    from test_prepare_command import _clean_rank as clean

    import __main__

    clean()
    for name in ("MoEConfig", "MoEGPT"):
        vars(__main__).pop(name, None)
    return True


def test_prepare_magic_ep2(shell, ranks4, capsys):
    from workbench.planner.live import TOLERANCE

    """``%distrain prepare ep=2`` on 4 ranks: the summary names the mesh, every rank holds a
    quarter of every tensor (experts: half over ep, half of that over dp_shard_mod_ep), as
    the planner's memory prediction (``%distrain plan``) says;
    on a dense GPT the magic refuses, naming why, with the model unchanged."""
    try:
        assert shell.run_cell(MOE_BUILD).success
        capsys.readouterr()
        r = shell.run_cell("%distrain prepare ep=2")
        assert r.success, r.error_in_exec
        out = capsys.readouterr().out
        assert "mesh dp_shard_mod_ep=2 x ep=2" in out and "expert parallel over ep=2" in out, out
        fig = shell.run_cell("%distrain layout").result
        z = [v for row in fig.data[0].z for v in row]
        assert z and all(v == pytest.approx(0.25) for v in z)
        r = shell.run_cell("%distrain plan")  # the planner's ep layout: experts / ep / dp_shard_mod_ep
        assert r.success, r.error_in_exec
        states = r.result[r.result["part"].isin(["parameters", "gradients", "optimizer"])]
        assert ((states["ratio"] - 1).abs() <= TOLERANCE).all(), states
        assert shell.run_cell("%%distrain\nmodel = GPT(GPTConfig.tiny())").success
        r = shell.run_cell("%distrain prepare ep=2")
        msg = str(r.error_in_exec)
        assert not r.success and "GPTConfig has no experts: use ep=1" in msg
        assert "nothing was changed on the ranks" in msg
        assert ranks4.apply(lambda: getattr(__import__("__main__").model, "_workbench_prepared", None)) == [None] * 4
    finally:
        ranks4.apply(_clean_rank)
