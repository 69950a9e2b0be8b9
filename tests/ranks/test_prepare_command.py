"""``%distrain prepare``, ``%distrain layout`` and ``%distrain plan --live`` through a real
IPython shell on the shared 4 gloo ranks.

Each test builds a fresh model on the ranks (a prepared model cannot be re-prepared) and
leaves the ranks clean: the ``model``/``optimizer``/``prepared`` variables are deleted,
the Prepared is closed and ``workbench.engine.session`` cleared.
"""

from __future__ import annotations

import re

import pytest

BUILD = (
    "%%distrain\nimport torch\nfrom workbench.models import GPT, GPTConfig\ntorch.manual_seed(0)\n"
    "model = GPT(GPTConfig.tiny(dim=128, n_heads=4, n_kv_heads=4, ffn_dim=256, max_seq_len=64))\n"
    "optimizer = lambda ps: torch.optim.AdamW(ps, lr=1e-3)\n"
)


def _clean_rank() -> list[str]:
    """On a rank: close and forget the Prepared, delete the variables the tests made."""
    import __main__
    from workbench.engine import session
    from workbench.strategies import reset_accelerate_state

    if session.has_prepared():
        session.prepared().close()
    session.clear()
    reset_accelerate_state()
    ns = vars(__main__)
    for name in ("model", "optimizer", "prepared", "torch", "GPT", "GPTConfig", "_fingerprint"):
        ns.pop(name, None)
    return sorted(n for n in ns if n.startswith("_workbench") or n == "_wb_engine")


def _fingerprint() -> tuple:
    """On a rank: the model's class, whether it was prepared, and a checksum of its weights."""
    import __main__

    model = vars(__main__)["model"]
    total = sum(float(p.detach().double().sum()) for p in model.parameters())
    return type(model).__name__, getattr(model, "_workbench_prepared", None), round(total, 6)


@pytest.fixture
def ranks(shell, ranks4):
    yield ranks4
    leftovers = ranks4.apply(_clean_rank)
    assert leftovers == [[]] * 4, f"helper variables left on the ranks: {leftovers}"


def run(shell, cell):
    return shell.run_cell(cell)


def test_prepare_fsdp2_lays_out_and_summarises(shell, ranks, capsys):
    from workbench.planner.live import TOLERANCE

    assert run(shell, BUILD).success
    capsys.readouterr()
    r = run(shell, "%distrain prepare fsdp2")
    assert r.success, r.error_in_exec
    out = capsys.readouterr().out
    assert "fsdp2 via the native path on mesh dp_shard=4" in out
    assert "rank 3" in out and "whole model" in out and "note: fully_shard" in out
    assert ranks.apply(lambda: type(__import__("__main__").model).__name__) == ["FSDPGPT"] * 4

    fig = run(shell, "%distrain layout").result
    z = [v for row in fig.data[0].z for v in row]
    assert z and all(v == pytest.approx(0.25) for v in z)  # every tensor: a quarter per rank

    r = run(shell, "%distrain plan --live")
    assert r.success, r.error_in_exec
    out = capsys.readouterr().out
    assert "plan: gpt" in out and "layout: dp_shard=4 zero3  [fp32]" in out and "predicted vs measured" in out
    # the attention kernel is measured on the ranks (the GPT calls SDPA: a fused kernel)
    assert "attention kernel on the ranks: flash (_scaled_dot_product_flash_attention_for_cpu" in out
    df = r.result
    assert set(df["part"]) >= {"parameters", "gradients", "optimizer", "activations"}
    assert sorted(set(df["rank"])) == [0, 1, 2, 3]
    states = df[df["part"].isin(["parameters", "gradients", "optimizer"])]
    assert ((states["ratio"] - 1).abs() <= TOLERANCE).all(), states


def test_layout_under_ddp_is_full_shares(shell, ranks):
    assert run(shell, BUILD).success
    assert run(shell, "%distrain prepare ddp").success
    fig = run(shell, "%distrain layout --max 5").result
    z = [v for row in fig.data[0].z for v in row]
    assert len(fig.data[0].y) == 5 and all(v == 1.0 for v in z)


def test_layout_tensor_under_tp_shows_column_and_row_split(shell, ranks):
    from workbench.engine import rpc
    from workbench.notebook.dashboard.layout_figure import tensor_blocks

    assert run(shell, BUILD).success
    assert run(shell, "%distrain prepare tp").success
    fig = run(shell, "%distrain layout --tensor layers.0.attention.wq.weight").result
    assert "Shard(0)" in fig.layout.title.text and len(fig.layout.shapes) == 4
    layouts = [lay.to_dict() for lay in ranks.apply(rpc.handle, rpc.Layout())]
    # column-parallel wq (weight [out, in]): rows split, one quarter per rank
    _, _, blocks = tensor_blocks(layouts, "layers.0.attention.wq.weight")
    assert list(blocks) == [((i * 32, (i + 1) * 32), (0, 128)) for i in range(4)]
    assert list(blocks.values()) == [[0], [1], [2], [3]]
    # row-parallel wo: columns split
    _, placements, blocks = tensor_blocks(layouts, "layers.0.attention.wo.weight")
    assert placements == ["Shard(1)"]
    assert list(blocks) == [((0, 128), (i * 32, (i + 1) * 32)) for i in range(4)]
    r = run(shell, "%distrain layout --tensor no.such.tensor")
    assert not r.success and "no tensor named 'no.such.tensor'" in str(r.error_in_exec)


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("%distrain prepare fsdp2_tp tp=3", "tp=3 does not divide world_size=4"),
        ("%distrain prepare tp tp=3", "tp=3"),
        ("%distrain prepare tp", "tp=4 does not divide n_heads=2"),
    ],
)
def test_bad_spec_is_refused_and_model_unchanged(shell, ranks, line, fragment):
    build = BUILD.replace("n_heads=4, n_kv_heads=4", "n_heads=2, n_kv_heads=2") if "n_heads=2" in fragment else BUILD
    assert run(shell, build).success
    before = ranks.apply(_fingerprint)
    r = run(shell, line)
    assert not r.success
    msg = str(r.error_in_exec)
    assert fragment in msg and "nothing was changed on the ranks" in msg
    assert len(msg.splitlines()) == 1
    assert ranks.apply(_fingerprint) == before
    assert before[0][:2] == ("GPT", None)


def test_a_prepare_that_fails_on_the_ranks_is_shown_per_rank_and_binds_nothing(shell, ranks, capsys):
    assert run(shell, BUILD.replace("optimizer = lambda ps: torch.optim.AdamW(ps, lr=1e-3)", "optimizer = 5")).success
    capsys.readouterr()
    r = run(shell, "%distrain prepare ddp")
    assert not r.success
    assert "the cell failed on rank(s) 0-3" in str(r.error_in_exec)
    err = re.sub(r"\x1b\[[0-9;]*m", "", capsys.readouterr().err)
    assert all(f"[rank {k}]" in err for k in range(4)) and "Traceback" in err, err
    # shown as a cell's error: from the prepare down, none of the apply machinery's frames
    assert "PrepareError: optimizer must be a torch.optim.Optimizer" in err and "do_apply" not in err
    # the rank's variables are rebound only by a prepare that succeeded
    names = ranks.apply(lambda: sorted({"prepared", "optimizer"} & set(vars(__import__("__main__")))))
    assert names == [["optimizer"]] * 4
    assert ranks.apply(lambda: __import__("__main__").optimizer) == [5] * 4
