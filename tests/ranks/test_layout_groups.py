"""Tier 2: the process groups of a layout live exactly as long as some model uses them.

On the shared live gloo ranks (``ranks4``): every gloo group runs a loop thread that wakes
a hundred times a second, so a rank that tried ``fsdp2 tp=2`` (two sub-groups) and then
went on to DDP must not carry those groups any more once no model of theirs is left; a
model the user still holds keeps its groups and trains; preparing the same layout again
reuses them; DeepSpeed's groups go the same way and its next ``initialize`` still trains.
"""

from __future__ import annotations

import math


# ------------------------------------------------------------------ rank-side function
def layout_groups_on_rank() -> dict:
    import gc
    import os

    import torch
    import torch.distributed.distributed_c10d as c10d

    from workbench.models import GPT, GPTConfig, TextDataset, batch_at
    from workbench.strategies import prepare

    cfg = GPTConfig.tiny(n_layers=4, n_kv_heads=4)
    data = TextDataset(cfg.max_seq_len)

    def counts() -> dict:
        gc.collect()
        loops = 0
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/comm") as f:
                    loops += f.read().strip() == "gloo_tcp_loop"
            except OSError:  # the thread ended while we listed
                pass
        return {"groups": len(c10d._world.pg_map), "gloo_loops": loops}

    def fresh(spec):
        torch.manual_seed(0)
        return prepare(GPT(cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-2), spec)

    def train(p, steps, start=0):
        return [p.train_step(batch_at(data, 8, start + i, dp_rank=p.dp_rank, dp_size=p.dp_size)) for i in range(steps)]

    out = {"base": counts()}
    held = fresh("fsdp2 tp=2")
    out["held_first"] = train(held, 2)
    out["fsdp2_tp"] = counts()

    ddp = fresh("ddp")  # the fsdp2+tp model is still held here: its groups must stay
    out["ddp_while_held"] = counts()
    out["held_after_ddp"] = train(held, 1, start=2)

    del held
    ddp.close()
    again = fresh("ddp")  # nothing uses fsdp2+tp any more: its groups go
    out["ddp_after_release"] = counts()
    out["ddp_losses"] = train(again, 4)

    again.close()
    twice = [fresh("fsdp2 tp=2") for _ in range(2)]  # the same layout twice: one set of groups
    out["fsdp2_tp_twice"] = counts()
    out["tp_group_reused"] = [p.mesh.get_group("tp").group_name for p in twice]
    del twice

    zero = fresh("zero zero_stage=2")
    out["zero_first"] = train(zero, 1)
    out["zero"] = counts()
    zero.close()
    del zero
    plain = fresh("ddp")  # DeepSpeed's and fsdp2+tp's groups go
    out["after_zero"] = counts()
    plain.close()
    zero = fresh("zero zero_stage=2")  # DeepSpeed makes its groups anew and trains
    out["zero_again"] = train(zero, 3)
    zero.close()
    return out


def notebook_flow_on_rank() -> dict:
    """A training cell re-run with another layout, as a notebook does it: the name ``p`` and
    the rank's current model both move to the new one."""
    import gc

    import torch
    import torch.distributed.distributed_c10d as c10d

    from workbench import engine
    from workbench.engine import session
    from workbench.models import GPT, GPTConfig, TextDataset, batch_at

    cfg = GPTConfig.tiny(n_layers=4, n_kv_heads=4)
    gc.collect()
    out = {"base": len(c10d._world.pg_map), "after": []}
    p = None
    try:
        for spec in ("fsdp2 tp=2", "ddp", "ddp"):
            torch.manual_seed(0)
            p = engine.prepare(GPT(cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-2), spec)
            out["after"].append(len(c10d._world.pg_map))
        out["loss"] = p.train_step(batch_at(TextDataset(cfg.max_seq_len), 8, 0, dp_rank=p.dp_rank, dp_size=p.dp_size))
        out["current_is_last"] = session.prepared() is p
    finally:
        if p is not None:
            p.close()
        session.clear()
    return out


# ------------------------------------------------------------------ tests
def test_groups_freed_once_unused_kept_while_used(ranks4):
    for r in ranks4.apply(layout_groups_on_rank):
        base, sub = r["base"], r["fsdp2_tp"]
        # fsdp2 tp=2 on 4 ranks: a dp_shard and a tp group, each with its own gloo loop
        assert sub["groups"] == base["groups"] + 2 and sub["gloo_loops"] == base["gloo_loops"] + 2, r
        # still held: kept, and it still trains after DDP was prepared
        assert r["ddp_while_held"] == sub, r
        assert all(math.isfinite(x) for x in r["held_first"] + r["held_after_ddp"]), r
        # released: back to where the rank started; the re-prepared DDP model trains
        assert r["ddp_after_release"] == base, r
        assert r["ddp_losses"][-1] < r["ddp_losses"][0], r
        # the same layout prepared twice in a row shares one set of groups
        assert r["fsdp2_tp_twice"] == sub, r
        assert r["tp_group_reused"][0] == r["tp_group_reused"][1], r
        # DeepSpeed's own group is freed too, and a later ZeRO prepare trains
        assert r["zero"]["groups"] == base["groups"] + 1, r
        assert r["after_zero"] == base, r
        assert r["zero_again"][-1] < r["zero_again"][0] and r["zero_again"][0] == r["zero_first"][0], r


def test_notebook_rerun_with_another_layout_frees_the_old_groups(ranks4):
    for r in ranks4.apply(notebook_flow_on_rank):
        fsdp2_tp, ddp_first, ddp_again = r["after"]
        # while the first ddp prepare runs, ``p`` still names the fsdp2+tp model: its groups
        # stay; once ``p`` names the ddp one, the next prepare frees them (both of them). The
        # base may hold an earlier test's unused layout, freed by the first prepare here.
        assert ddp_first == fsdp2_tp and ddp_again == fsdp2_tp - 2 and ddp_again <= r["base"], r
        assert math.isfinite(r["loss"]) and r["current_is_last"], r
