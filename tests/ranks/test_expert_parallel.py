"""Expert parallel through ``prepare`` (``ep=N``) on real gloo ranks.

``ep`` borrows ranks from ``dp_shard`` (torchtitan): the mesh is ``dp_shard_mod_ep x ep``;
each MoE layer's experts are split over ``ep`` and FSDP2-sharded over ``dp_shard_mod_ep``,
everything else FSDP2-sharded over the whole ``dp_shard``. Checked here: the first step's
gathered gradients and three steps' losses equal one process (fp32, 1e-5) on 2 ranks
(``ep=2``) and on 4 (``ep=2`` x ``dp_shard_mod_ep=2``); with capacity dropping and the
auxiliary loss on, ``ep=2`` trains exactly as ``fsdp2`` without ep; each rank holds the
experts the layout says; the spec errors and a model without experts are refused with one
message, the model as it was and the next prepare working; ``%distrain prepare ep=2`` does
the same through the magic. A tiny transformers Qwen3-MoE (fused experts) under ``ep``
matches one process the same way, also read from a ``save_pretrained`` folder and trained
by ``engine.Trainer``. Checkpoints saved from ``ep=2`` x ``dp_shard_mod_ep=2`` load back into
the same layout, into ``fsdp2`` or ``ep=2`` on 2 ranks and into a plain model on one process
(values, logits, the next steps' losses), and export (``--hf``: for ``from_pretrained``).
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
        ("ep=2 tp=2", "ep=2 with tp=2 is not supported here: expert parallel is built over dp_shard alone ('ep=2' or"),
        ("ep=2 tp=2", "Use ep without tp, or tp=2 without ep"),
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
        (no_experts, same1), (split, same2), (listed, same3), (three, same4) = r["refused"]
        assert no_experts.startswith("ep=2: BlocksNet has no experts (no workbench.models.MoE layer"), no_experts
        assert "Use ep=1" in no_experts and "Qwen3-MoE" in no_experts and same1
        assert "already split by workbench.models.expert_parallel()" in split and same2
        assert "ListedExperts keeps its experts as separate modules (experts is a list of 4)" in listed, listed
        assert "stacked expert weights" in listed and "Use ep=1" in listed and same3
        assert "ep=2 does not divide the 3 experts of model.layers.0.mlp.experts; use ep in [3]" in three, three
        assert same4
        assert len(r["after"]) == 2 and all(loss > 0 for loss in r["after"])


# ------------------------------------------------------------------ a transformers MoE
@pytest.mark.parametrize(
    "spec,world,model", [("ep=2", 2, "qwen3"), ("ep=2", 4, "qwen3"), ("ep=4", 4, "qwen3"), ("ep=2", 2, "mixtral")]
)
def test_hf_moe_under_ep_matches_one_process(spec, world, model, ranks2, ranks4):
    """A tiny random-init ``Qwen3MoeForCausalLM`` / ``MixtralForCausalLM`` (fused experts,
    ``gate_up_proj [4, 96, 32]``): prepare finds its experts, each rank keeps ``4 / ep`` of
    them, and the first step's gradients and three steps' losses equal one process's (fp32, 1e-5)."""
    pytest.importorskip("transformers")
    ep = int(spec.split("=")[1])
    rows = (ranks2 if world == 2 else ranks4).apply(E.run, spec, model=model)
    kind = {"qwen3": "Qwen3MoeExperts", "mixtral": "MixtralExperts"}[model]
    for rank, r in enumerate(rows):
        assert r["grad_err"] <= TOL, (rank, r["grad_worst"], r["grad_err"])
        assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(r["losses"], r["want"])), (rank, r["losses"], r["want"])
        assert r["want"][-1] < r["want"][0] and r["dp"] == (rank, world)
        assert any(f"expert parallel over ep={ep}: 2 MoE layers ({kind})" in n for n in r["notes"])
        assert r["w1_placements"][1] == "Shard(0)" and r["w1_mesh"] == ["dp_shard_mod_ep", "ep"]
        per = 4 // world  # experts per rank: split over ep, then over dp_shard_mod_ep by FSDP2
        assert r["w1_local"] == (per, 96, 32)
        first = (rank % ep) * (4 // ep) + (rank // ep) * per
        assert r["w1_holds"] == [[first, first + per]], (rank, r["w1_holds"])


# ------------------------------------------------------------------ checkpoints
def _close(a: float, b: float, rel: float = TOL) -> bool:
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def _same_values(got: dict, want: dict) -> None:
    import torch

    assert sorted(got) == sorted(want)
    for name, value in want.items():
        assert got[name].shape == value.shape and torch.equal(got[name], value), name


@pytest.fixture
def ck_clean(ranks2, ranks4):
    yield
    for rs in (ranks2, ranks4):
        rs.apply(E.ck_clean, timeout=60)


def test_ep_checkpoint_loads_back_and_reshards_to_fsdp2_and_one_process(ranks4, ranks2, ck_clean, tmp_path):
    """Saved from ``ep=2`` x ``dp_shard_mod_ep=2`` on 4 ranks (each rank holds one expert of
    four per MoE layer): loaded into the same layout, into ``fsdp2`` on 2 ranks and into a
    plain model in one process (no process group), each time with the saved values, the
    saved logits and the next two steps' losses (weights and AdamW state) of the run that
    went on; exported, the tensors are the saved ones."""
    import torch

    from workbench.notebook import checkpoints as ck

    root = str(tmp_path)
    assert ranks4.apply(E.ck_build, "ep=2")[0] == {"shape": [2, 2], "dim_names": ["dp_shard_mod_ep", "ep"]}
    ranks4.apply(E.ck_train, 2)
    values, logits = ranks4.apply(E.ck_live)[0]
    info = ck.save(root=root, rankset=ranks4)
    assert info["step"] == 2
    ref = ranks4.apply(E.ck_train, 2)[0]  # steps 2 and 3 after the save
    assert sorted(ref) == [0, 1, 2, 3]

    # the same layout, a model from another seed
    ranks4.apply(E.ck_build, "ep=2", seed=1)
    loaded = ck.load("latest", root=root, rankset=ranks4)
    assert (loaded["from_strategy"], loaded["from_world_size"], loaded["world_size"]) == ("fsdp2", 4, 4)
    for v, lg in ranks4.apply(E.ck_live):
        _same_values(v, values)
        assert torch.allclose(lg, logits, rtol=1e-5, atol=1e-6)
    got = ranks4.apply(E.ck_train, 2)[0]
    assert sorted(got) == [2, 3] and all(_close(got[s], ref[s]) for s in (2, 3)), (got, ref)

    # another layout: fsdp2 (no ep) on 2 ranks
    assert ranks2.apply(E.ck_build, "fsdp2", seed=1)[0] == {"shape": [2], "dim_names": ["dp_shard"]}
    ck.load("latest", root=root, rankset=ranks2)
    for v, lg in ranks2.apply(E.ck_live):
        _same_values(v, values)
        assert torch.allclose(lg, logits, rtol=1e-5, atol=1e-6)
    got = ranks2.apply(E.ck_train, 2)[0]
    assert all(_close(got[s], ref[s]) for s in (2, 3)), (got, ref)

    # one process, a plain model, no process group
    one = E.one_process_load(str(tmp_path / info["name"]))
    assert one["info"]["step"] == 2 and one["info"]["world_size"] == 1
    _same_values(one["values"], values)
    assert torch.allclose(one["logits"], logits, rtol=1e-5, atol=1e-6)
    assert all(_close(one["losses"][s], ref[s]) for s in (2, 3)), (one["losses"], ref)

    out = tmp_path / "moe.safetensors"
    ck.export(str(out), root=root, rankset=ranks4)
    from safetensors.torch import load_file

    _same_values(load_file(str(out)), values)


def test_hf_moe_ep_checkpoint_reshards_and_exports_for_from_pretrained(ranks4, ranks2, ck_clean, tmp_path):
    """A transformers Qwen3-MoE saved from ``ep=2`` x ``dp_shard_mod_ep=2`` on 4 ranks loads
    into ``ep=2`` on 2 ranks (values, logits, next loss), and ``ckpt export --hf`` writes a
    folder as ``save_pretrained`` would (experts one at a time) that ``from_pretrained``
    loads with the saved weights and logits."""
    pytest.importorskip("transformers")
    import torch
    from transformers import AutoModelForCausalLM

    from workbench.notebook import checkpoints as ck

    root = str(tmp_path)
    ranks4.apply(E.ck_build, "ep=2", model="qwen3")
    ranks4.apply(E.ck_train, 2)
    values, logits = ranks4.apply(E.ck_live)[0]
    ck.save(root=root, rankset=ranks4)
    ref = ranks4.apply(E.ck_train, 1)[0]

    assert ranks2.apply(E.ck_build, "ep=2", model="qwen3", seed=1)[0]["dim_names"] == ["dp_shard_mod_ep", "ep"]
    ck.load("latest", root=root, rankset=ranks2)
    for v, lg in ranks2.apply(E.ck_live):
        _same_values(v, values)
        assert torch.allclose(lg, logits, rtol=1e-5, atol=1e-6)
    got = ranks2.apply(E.ck_train, 1)[0]
    assert _close(got[2], ref[2]), (got, ref)

    out = tmp_path / "qwen3_moe_hf"
    info = ck.export(str(out), root=root, hf=True, rankset=ranks4)
    assert info["architectures"] == ["Qwen3MoeForCausalLM"] and info["names"] == "save_pretrained"
    from safetensors import safe_open

    with safe_open(str(out / "model.safetensors"), "pt") as f:  # experts one at a time, as save_pretrained writes
        keys = set(f.keys())
    assert "model.layers.1.mlp.experts.3.up_proj.weight" in keys and not any("gate_up_proj" in k for k in keys)
    hf = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    assert type(hf).__name__ == "Qwen3MoeForCausalLM" and hf.config.num_experts == 4
    _same_values({n: q.detach() for n, q in hf.named_parameters()}, values)
    with torch.no_grad():
        assert torch.allclose(hf(E.LOGITS_X).logits, logits, rtol=1e-5, atol=1e-6)


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
    the planner's memory prediction (``%distrain plan --live``) says;
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
        r = shell.run_cell("%distrain plan --live")  # the planner's ep layout: experts / ep / dp_shard_mod_ep
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


def test_hf_moe_pretrained_folder_into_ep_then_the_trainer_matches_one_process(ranks2, tmp_path):
    """``save_pretrained`` writes a Qwen3-MoE's experts one at a time; ``load_pretrained``
    stacks them into the ``ep=2`` layout, each rank reading only its two experts, and
    ``engine.Trainer`` on ``{input_ids, labels}`` batches trains it as one process would."""
    pytest.importorskip("transformers")
    rows = ranks2.apply(E.pretrained_then_trainer, str(tmp_path / "qwen3_moe"), timeout=600)
    for r in rows:
        info = r["info"]
        assert info["unexpected"] == [] and info["tensors"] == 25, info  # 2 stacked per layer from 12 per-expert keys
        assert info["bytes_read"] == info["bytes_held"], info  # its experts, its FSDP2 shards: nothing more
        assert r["state"] == "finished"
        assert len(r["losses"]) == E.STEPS and r["want"][-1] < r["want"][0]
        assert all(abs(a - b) <= TOL * abs(b) for a, b in zip(r["losses"], r["want"])), (r["losses"], r["want"])
