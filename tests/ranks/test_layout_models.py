"""Any model laid out by degrees: a user's ``nn.Module`` (blocks in ``.blocks``, nested, or
none), and tiny random-init transformers Llama / GPT-2 (built from configs, no download).

On the shared gloo ranks: FSDP2 wraps every block, activation checkpointing and compile
apply per block, the losses of every layout equal a 1-rank run (fp32, 1e-5 relative), the
HF Llama's tensor-parallel forward equals the unsharded one, and every bad input gets one
message with the model untouched and the ranks usable. The rank-side code is in
``tests/layout_ranks.py``. Pure parts (degrees, presets, block discovery) run in-process.
"""

from __future__ import annotations

import functools

import layout_ranks as L
import pytest
import torch

from workbench.strategies import ParallelDims, PrepareError, SpecError, StrategySpec, find_blocks

pytest.importorskip("transformers")


@functools.cache
def ref(name: str) -> tuple:
    return tuple(L.reference_losses(name))


def _assert_parity(results, name: str, specs) -> None:
    want = ref(name)
    assert want[-1] < want[0]  # it trains
    for rank, res in enumerate(results):
        for spec in specs:
            got = res[spec][0]
            worst = max(abs(a - b) / abs(b) for a, b in zip(got, want))
            assert len(got) == len(want) and worst <= 1e-5, f"{name} {spec} rank {rank}: {worst:.1e} {got} {list(want)}"


# ------------------------------------------------------------------ pure: degrees and presets
def test_degrees_resolve_with_one_rest_and_enabled_views():
    d = ParallelDims.build(8, dp_shard=-1, tp=2, pp=2)
    assert (d.dp_replicate, d.dp_shard, d.tp, d.pp) == (1, 2, 2, 2)
    assert d.dp_shard_enabled and d.tp_enabled and d.pp_enabled and not d.dp_replicate_enabled and not d.cp_enabled
    assert d.mesh_dims() == ((2, 2, 2), ("pp", "dp_shard", "tp"))
    assert ParallelDims.build(4, dp_shard=2, tp=-1).tp == 2
    with pytest.raises(ValueError, match="only one degree may be -1"):
        ParallelDims.build(4, dp_shard=-1, tp=-1)
    with pytest.raises(ValueError, match="= 6 ranks, but the world has 4"):
        ParallelDims.build(4, dp_shard=3, pp=2)


@pytest.mark.parametrize(
    "text,world,kind,mesh",
    [
        ("ddp", 4, "ddp", {"dp_replicate": 4}),
        ("fsdp2", 4, "fsdp2", {"dp_shard": 4}),
        ("hsdp", 4, "fsdp2", {"dp_replicate": 2, "dp_shard": 2}),
        ("tp", 4, "tp", {"tp": 4}),
        ("fsdp2 tp=2", 4, "fsdp2_tp", {"dp_shard": 2, "tp": 2}),
        ("pp=2 dp_shard=2", 4, "pp", {"pp": 2, "dp_shard": 2}),
        ("pp=2 dp_shard=2 tp=2", 8, "pp", {"pp": 2, "dp_shard": 2, "tp": 2}),
        ("dp_shard=2 tp=-1", 8, "fsdp2_tp", {"dp_shard": 2, "tp": 4}),
        ("zero stage=3", 4, "zero", {"dp": 4}),
    ],
)
def test_presets_are_degrees(text, world, kind, mesh):
    s = StrategySpec.parse(text).validate(world)
    assert s.kind == kind
    m = s.mesh_plan(world)
    assert dict(zip(m.dim_names, m.shape)) == mesh


@pytest.mark.parametrize(
    "text,needle",
    [
        ("ddp cp=2", "context parallel shards the parameters"),
        ("ep=2 tp=2", "ep=2 with tp=2 is not supported here"),
        ("dp_replicate=2 tp=2", "use dp_shard=2"),
        ("pp=2 dp_shard=3", "sizes that fit: dp_shard=1 x pp=4, dp_shard=2 x pp=2"),
    ],
)
def test_degree_errors_name_what_fits(text, needle):
    with pytest.raises(SpecError) as e:
        StrategySpec.parse(text).validate(4)
    assert needle in str(e.value)


def test_hsdp_on_cuda_takes_the_native_path():
    """Accelerate's FSDP plugin here builds a 1-D mesh: HSDP would be applied as plain FSDP2."""
    from workbench.strategies.accelerate_path import choose_path

    assert choose_path(StrategySpec.parse("hsdp").resolve(4), "cuda")[0] == "native"
    assert choose_path(StrategySpec.parse("fsdp2").resolve(4), "cuda")[0] == "accelerate"


# ------------------------------------------------------------------ pure: blocks
@pytest.mark.parametrize(
    "name,blocks,source",
    [
        ("blocks", ["blocks.0", "blocks.1", "blocks.2", "blocks.3"], "repeated container"),
        ("nested", ["trunk.1.units.u0", "trunk.1.units.u1", "trunk.1.units.u2"], "repeated container"),
        ("llama", [f"model.layers.{i}" for i in range(4)], "_no_split_modules"),
        ("gpt2", [f"transformer.h.{i}" for i in range(4)], "_no_split_modules"),
    ],
)
def test_blocks_found_in_any_model(name, blocks, source):
    found = find_blocks(L.build(name))
    assert list(found.names) == blocks and found.source == source


def test_blocks_argument_and_none_found():
    net = L.build("flat")
    with pytest.raises(PrepareError) as e:
        find_blocks(net)
    assert "no blocks found" in str(e.value) and "head (Linear" in str(e.value) and "blocks=" in str(e.value)
    assert find_blocks(net, ["mix", "head"]).names == ("mix", "head")
    assert find_blocks(L.build("blocks"), "MLPBlock").names == tuple(f"blocks.{i}" for i in range(4))
    assert find_blocks(L.build("nested"), lambda m: isinstance(m, L.MLPBlock)).source == "blocks="
    assert find_blocks(L.build("blocks"), ["blocks.*"]).names == tuple(f"blocks.{i}" for i in range(4))


def test_pipeline_stages_even_or_at_given_boundaries():
    from workbench.strategies.pipeline import check_splittable, split_points

    keys = [str(i) for i in range(5)]
    assert split_points(keys, 2) == [["0", "1", "2"], ["3", "4"]]
    assert split_points(keys, 3, [1, 4]) == [["0"], ["1", "2", "3"], ["4"]]
    with pytest.raises(PrepareError, match="give 1 increasing block indices"):
        split_points(keys, 2, [0])
    assert check_splittable(L.build("llama"), 2, [1]) == [["0"], ["1", "2", "3"]]
    with pytest.raises(PrepareError, match="each stage needs a block; use pp <= 4"):
        check_splittable(L.build("llama"), 8)
    with pytest.raises(PrepareError, match="cannot split BlocksNet"):
        check_splittable(L.build("blocks"), 2)


# ------------------------------------------------------------------ ranks
LLAMA_SPECS = ["ddp", "fsdp2", "hsdp", "fsdp2 tp=2", "pp", "pp=2 dp_shard=2", "pp=2 tp=2", "fsdp2 ac=full"]


def test_hf_llama_loss_parity_every_layout(ranks4):
    results = ranks4.apply(L.train_specs, "llama", LLAMA_SPECS)
    _assert_parity(results, "llama", LLAMA_SPECS)
    lay = {s: results[0][s][1] for s in LLAMA_SPECS}
    assert lay["hsdp"]["mesh"] == {"shape": [2, 2], "dim_names": ["dp_replicate", "dp_shard"]}
    assert lay["pp=2 dp_shard=2"]["mesh"] == {"shape": [2, 2], "dim_names": ["pp", "dp_shard"]}
    # pipeline x FSDP2: rank 0 holds stage 0's blocks, each sharded over its dp_shard pair
    pp_fsdp = [r["pp=2 dp_shard=2"][1] for r in results]
    assert pp_fsdp[0]["blocks"] == ["model.layers.0", "model.layers.1"]
    assert pp_fsdp[2]["blocks"] == ["model.layers.2", "model.layers.3"]
    assert pp_fsdp[0]["placements"]["model.embed_tokens.weight"] == ["Stage(0)", "Shard(0)"]
    assert "lm_head.weight" in pp_fsdp[2]["placements"] and "lm_head.weight" not in pp_fsdp[0]["placements"]
    assert sum(r["local"] for r in pp_fsdp) == pytest.approx(pp_fsdp[0]["global"], rel=0.01)
    two_d = lay["fsdp2 tp=2"]["placements"]["model.layers.0.self_attn.q_proj.weight"]
    assert two_d == ["Shard(0)", "Shard(0)"] or two_d[1] == "Shard(0)"


def test_hf_llama_tensor_parallel_over_all_ranks(ranks4):
    """tp=4 needs 4 kv heads (the GQA model with 2 is refused: test_bad_inputs...)."""
    results = ranks4.apply(L.train_specs, "llama_mha", ["tp"])
    _assert_parity(results, "llama_mha", ["tp"])
    errs = ranks4.apply(L.tp_forward, "tp", "llama_mha") + ranks4.apply(L.tp_forward, "fsdp2 tp=2", "llama")
    assert max(errs) < 1e-5, errs


def test_user_model_loss_parity(ranks4):
    specs = ["ddp", "fsdp2", "hsdp", "fsdp2 tp=2", "fsdp2 ac=selective"]
    results = ranks4.apply(L.train_specs, "blocks", specs, tp_plan=L.USER_TP_PLAN)
    _assert_parity(results, "blocks", specs)
    assert results[0]["fsdp2"][1]["blocks"] == [f"blocks.{i}" for i in range(4)]
    assert results[0]["fsdp2 tp=2"][1]["placements"]["blocks.0.up.weight"][1] == "Shard(0)"  # colwise over tp


def test_fsdp2_ac_and_compile_wrap_every_block(ranks4):
    cases = [
        ("blocks", "fsdp2 ac=full"),
        ("nested", "fsdp2 ac=full compile"),
        ("llama", "fsdp2 ac=full compile"),
        ("gpt2", "fsdp2 ac=full compile"),
        ("gpt2", "fsdp2 ac=selective"),
    ]
    rows = ranks4.apply(_wrap_all, cases)
    for got in rows:
        for (name, spec), r in zip(cases, got):
            blocks = r["blocks"]
            assert blocks == list(find_blocks(L.build(name)).names), (name, r)
            assert r["fsdp"] == [""] + blocks, (name, spec, r["fsdp"])  # every block + the root, nothing else
            every = blocks if "full" in spec else blocks[::2]
            assert r["checkpointed"] == sorted(every), (name, spec)
            assert r["compiled"] == (sorted(blocks) if "compile" in spec else []), (name, spec)
            if "loss" in r:
                assert r["loss"] > 0


def _wrap_all(cases):
    import layout_ranks as L

    return [L.wrapping(name, spec) for name, spec in cases]


def test_bad_inputs_one_message_ranks_usable(ranks4):
    rows = ranks4.apply(L.bad_inputs)
    for r in rows:
        assert r["groups"], "a refused prepare created process groups"
        for (name, spec, _, words), (msg, same) in zip(L.BAD, r["rows"]):
            assert msg is not None, (name, spec)
            assert all(w in msg for w in words), (name, spec, msg)
            assert same, f"{name} {spec}: the model changed though prepare refused"
        assert r["after"][0] == pytest.approx(ref("llama")[0], rel=1e-5)  # the next prepare works
    assert len({tuple(m for m, _ in r["rows"]) for r in rows}) == 1  # the same message on every rank


def _build_flat_on_rank(_unused=None):
    import layout_ranks as L

    import __main__

    ns = vars(__main__)
    ns["model"], ns["optimizer"] = L.build("flat"), (lambda ps: torch.optim.AdamW(ps, lr=L.LR))
    return True


def _clean_rank():
    import __main__
    from workbench.engine import session

    if session.has_prepared():
        session.prepared().close()
    session.clear()
    for name in ("model", "optimizer", "prepared"):
        vars(__main__).pop(name, None)
    return True


def test_magic_refuses_a_model_without_blocks_then_takes_blocks(shell, ranks4, capsys):
    """``%distrain prepare fsdp2`` on a model with no repeated blocks: one message on the
    notebook, nothing changed on the ranks; ``--blocks`` names them and the summary lists
    the degrees and the blocks wrapped."""
    try:
        ranks4.apply(_build_flat_on_rank, None)
        r = shell.run_cell("%distrain prepare fsdp2")
        msg = str(r.error_in_exec)
        assert not r.success and "no blocks found in FlatNet" in msg and "nothing was changed on the ranks" in msg
        assert ranks4.apply(lambda: type(__import__("__main__").model).__name__) == ["FlatNet"] * 4
        capsys.readouterr()
        r = shell.run_cell("%distrain prepare fsdp2 --blocks mix,head")
        assert r.success, r.error_in_exec
        out = capsys.readouterr().out
        assert "degrees: dp_shard=4" in out and "blocks (rank 0): mix, head" in out
        assert "fully_shard on 2 blocks + root" in out
    finally:
        ranks4.apply(_clean_rank)
