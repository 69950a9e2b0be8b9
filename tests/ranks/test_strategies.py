"""Strategies at world size 1 (one spawned gloo process) and their pure parts."""

import pytest
import torch
from gloo_harness import run_ranks

from workbench.strategies import (
    PrepareError,
    StrategySpec,
    check_optimizer_matches,
    prepare,
    registered,
    reset_accelerate_state,
)

KINDS_AT_1 = ["none", "ddp", "fsdp2", "zero", "zero3", "tp", "fsdp2_tp", "pp", "pp schedule=1f1b", "fsdp2 ac=selective"]


def world1_all_kinds(rank, world):
    import torch

    from workbench.models import GPT, GPTConfig, MoEConfig, MoEGPT, TextDataset, batches, expert_parallel
    from workbench.strategies import prepare

    out = {}
    for spec in KINDS_AT_1:
        torch.manual_seed(0)
        cfg = GPTConfig.tiny()
        p = prepare(GPT(cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-2), spec)
        losses = [p.train_step(b) for b in batches(TextDataset(32), 8, p.dp_rank, p.dp_size, seed=1, steps=3)]
        out[spec] = (losses, p.layout)
        p.close()
    torch.manual_seed(0)
    moe = MoEGPT(MoEConfig.tiny())
    x = torch.randint(0, 256, (2, 16))
    want = moe(x).detach()
    moe_ep = expert_parallel(moe)  # world 1: all experts local, two all_to_all_single calls
    out["moe_ep_err"] = float((moe_ep(x) - want).abs().max())
    return out


def test_every_strategy_at_world_size_1():
    res = run_ranks(world1_all_kinds, 1, timeout=600)[0]
    ref = res["none"][0]
    for spec in KINDS_AT_1:
        losses, layout = res[spec]
        assert losses == pytest.approx(ref, rel=1e-5), spec
        assert layout["world_size"] == 1 and layout["param_bytes_local"] == layout["param_bytes_global"]
        assert set(layout) >= {
            "version",
            "strategy",
            "path",
            "mesh",
            "rank",
            "world_size",
            "params",
            "param_bytes_local",
            "param_bytes_global",
            "notes",
        }
        e = layout["params"][0]
        assert set(e) == {
            "name",
            "global_shape",
            "local_shape",
            "placements",
            "dtype",
            "local_bytes",
            "global_bytes",
            "holds",
        }
        assert len(e["placements"]) == len(layout["mesh"]["shape"])
        assert any(n.startswith("path ") for n in layout["notes"])
    assert res["fsdp2"][1]["params"][0]["placements"] == ["Shard(0)"]
    # CPU ranks take the native path and say why (Accelerate's path is CUDA-only)
    assert res["ddp"][1]["path"] == "native" and res["ddp"][1]["notes"][0].startswith("path native: CPU ranks:")
    assert any("activation checkpointing (selective): 1/2" in n for n in res["fsdp2 ac=selective"][1]["notes"])
    assert res["moe_ep_err"] < 1e-6


def test_registry_has_every_kind():
    assert registered() == sorted(["none", "ddp", "fsdp2", "zero", "tp", "pp", "fsdp2_tp"])


def test_none_without_process_group_and_refusals():
    from workbench.models import GPT, GPTConfig

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    p = prepare(model, lambda ps: torch.optim.SGD(ps, lr=0.1), "none")
    x = torch.randint(0, 256, (2, 32))
    assert p.train_step((x, x)) > 0
    assert p.unwrap() is model and p.path == "native"
    with pytest.raises(PrepareError, match="already prepared"):
        prepare(model, lambda ps: torch.optim.SGD(ps, lr=0.1), "none")
    with pytest.raises(PrepareError, match="default process group"):
        prepare(GPT(GPTConfig.tiny()), lambda ps: torch.optim.SGD(ps, lr=0.1), "ddp")


def test_optimizer_instance_rebuilt_or_refused():
    from workbench.models import GPT, GPTConfig

    m = GPT(GPTConfig.tiny())
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3)
    p = prepare(m, opt, StrategySpec(kind="none"))
    assert p.optimizer is not opt and p.optimizer.defaults["lr"] == 3e-3
    stray = torch.optim.SGD([torch.nn.Parameter(torch.zeros(2))], lr=0.1)
    with pytest.raises(PrepareError, match="not the model's current parameters"):
        check_optimizer_matches(m, stray)


def test_reset_accelerate_state_imports_nothing_where_accelerate_never_ran():
    """A fresh rank's first prepare does not pay for importing accelerate and transformers."""
    import subprocess
    import sys

    code = (
        "import sys\nfrom workbench.strategies.accelerate_path import reset_accelerate_state\n"
        "reset_accelerate_state()\nprint(sorted(m for m in ('accelerate', 'transformers') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "[]"


def test_reset_accelerate_state_is_idempotent():
    from accelerate.state import PartialState

    reset_accelerate_state()
    reset_accelerate_state()
    PartialState()  # constructing after a reset works
    assert PartialState._shared_state != {}
    reset_accelerate_state()
    assert PartialState._shared_state == {}
