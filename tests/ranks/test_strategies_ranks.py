"""Tier 2: every strategy on the shared live gloo ranks (``ranks2``/``ranks4``).

Acceptance: 20 steps of the tiny GPT from the same seed and data give the single-rank
losses (fp32: 1e-5 relative; bf16 mixed precision: 2e-2 relative to fp32, since bf16 has an
8-bit mantissa and AdamW amplifies early rounding differences), FSDP2 and ZeRO-3 hold
~1/world of the parameter bytes, TP's forward equals the unsharded forward, GPipe and 1F1B
agree, invalid specs are refused before anything changes, strategies switch on the same
ranks, and the FSDP2 no_grad trap is caught.

The rank-side functions live at module level so the engines import them by name (the
rank sets put ``tests/`` on their ``sys.path``). Each leaves the ranks clean: it closes
its ``Prepared`` and resets Accelerate's process-wide state.
"""

from __future__ import annotations

import functools

import pytest
import torch

CFG = dict(n_layers=4, n_kv_heads=4)  # tiny, but splits 4 ways for tp and pp
STEPS, BATCH, LR, DATA_SEED = 20, 8, 1e-2, 1


# ------------------------------------------------------------------ rank-side functions
def _local_tensor_bytes(model) -> int:
    from torch.distributed.tensor import DTensor

    total = 0
    for p in model.parameters():
        if isinstance(p, DTensor):
            t = p.to_local()
        elif hasattr(p, "ds_tensor"):
            t = p.ds_tensor
        else:
            t = p
        total += t.numel() * t.element_size()
    return total


def train_on_rank(spec_text: str, steps: int = STEPS):
    import torch

    from workbench.models import GPT, GPTConfig, TextDataset, batches
    from workbench.strategies import prepare, reset_accelerate_state

    torch.manual_seed(0)
    cfg = GPTConfig.tiny(**CFG)
    p = prepare(GPT(cfg), lambda ps: torch.optim.AdamW(ps, lr=LR), spec_text)
    try:
        ds = TextDataset(cfg.max_seq_len)
        losses = [p.train_step(b) for b in batches(ds, BATCH, p.dp_rank, p.dp_size, seed=DATA_SEED, steps=steps)]
        return {"losses": losses, "layout": p.layout, "tensor_bytes": _local_tensor_bytes(p.unwrap())}
    finally:
        p.close()
        reset_accelerate_state()


def tp_forward_on_rank(sequence_parallel: bool):
    import copy

    import torch

    from workbench.models import GPT, GPTConfig
    from workbench.strategies import prepare

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny(**CFG))
    ref = copy.deepcopy(model)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = ref(x)
        p = prepare(model, lambda ps: torch.optim.SGD(ps, lr=0.1), f"tp sp={sequence_parallel}")
        got = p.model(x)
    return float((got - want).abs().max()), [e["placements"] for e in p.layout["params"][:3]]


def invalid_specs_on_rank(texts):
    import torch
    import torch.distributed as dist

    from workbench.models import GPT, GPTConfig
    from workbench.strategies import SpecError, prepare

    def groups():
        return len(dist.distributed_c10d._world.pg_names)

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    before = {n: (id(q), q.detach().clone()) for n, q in model.named_parameters()}
    n_groups = groups()
    messages = []
    for t in texts:
        try:
            prepare(model, lambda ps: torch.optim.AdamW(ps), t)
            messages.append(None)
        except SpecError as e:
            messages.append(str(e))
    unchanged = all(id(q) == before[n][0] and torch.equal(q, before[n][1]) for n, q in model.named_parameters())
    return messages, unchanged and type(model) is GPT, groups() == n_groups


def switch_on_rank(specs, steps: int = 3):
    out = []
    for s in specs:
        r = train_on_rank(s, steps=steps)
        out.append((r["layout"]["strategy"], r["losses"]))
    return out


def no_grad_trap_on_rank():
    import copy

    import torch
    import torch.distributed as dist

    from workbench.models import GPT, GPTConfig, TextDataset, batch_at
    from workbench.strategies import PrepareError, lm_loss, prepare

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    plain = copy.deepcopy(model)
    p = prepare(model, lambda ps: torch.optim.AdamW(ps, lr=LR), "fsdp2 reshard=false")
    x, y = batch_at(TextDataset(32), BATCH, 0, dp_rank=p.dp_rank, dp_size=p.dp_size)
    with torch.no_grad():  # what the first step's loss must be: the untouched model on these batches
        expected = lm_loss(plain(x), y)
        dist.all_reduce(expected)
        expected = float(expected) / dist.get_world_size()
    with torch.no_grad():
        p.model(x)  # leaves every FSDP module (root included) unsharded
    unsharded = not any(type(q).__name__ == "DTensor" for q in p.model.parameters())
    p.optimizer = torch.optim.AdamW(p.model.parameters(), lr=LR)  # the trap: plain tensors
    try:
        p.train_step((x, y))
        caught = None
    except PrepareError as e:
        caught = str(e)
    p.set_optimizer(lambda ps: torch.optim.AdamW(ps, lr=LR))  # the fix
    loss = p.train_step((x, y))
    return unsharded, caught, loss, expected


def moe_expert_parallel_on_rank():
    import copy

    import torch

    from workbench.models import MoEConfig, MoEGPT, expert_parallel

    torch.manual_seed(0)
    model = MoEGPT(MoEConfig.tiny(n_experts=4))
    x = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(3))
    ep = expert_parallel(copy.deepcopy(model))  # copy before a forward stores aux-loss graphs
    want = model(x)
    got = ep(x)
    got.square().mean().backward()
    grads_ok = all(q.grad is not None for q in ep.parameters())
    return float((got - want).abs().max()), tuple(ep.layers["0"].feed_forward.w1.shape), grads_ok


# ------------------------------------------------------------------ reference (this process)
@functools.cache
def reference_losses(steps: int = STEPS) -> tuple[float, ...]:
    from workbench.models import GPT, GPTConfig, TextDataset, batches
    from workbench.strategies import lm_loss

    torch.manual_seed(0)
    cfg = GPTConfig.tiny(**CFG)
    model = GPT(cfg)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out = []
    for x, y in batches(TextDataset(cfg.max_seq_len), BATCH, 0, 1, seed=DATA_SEED, steps=steps):
        loss = lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return tuple(out)


def _assert_losses(results, rel):
    ref = reference_losses()
    for rank, r in enumerate(results):
        got = r["losses"]
        assert len(got) == len(ref)
        worst = max(abs(a - b) / abs(b) for a, b in zip(got, ref))
        assert worst <= rel, f"rank {rank}: worst relative loss error {worst:.2e} > {rel:.0e}\n{got}\n{list(ref)}"
    assert ref[-1] < ref[0] - 1.0  # it actually trains


# ------------------------------------------------------------------ tests
SPECS = {
    2: [
        "ddp",
        "fsdp2",
        "fsdp2 reshard=false",
        "zero stage=1",
        "zero stage=2",
        "zero3",
        "tp",
        "fsdp2_tp tp=2",
        "pp",
        "pp schedule=1f1b",
        "fsdp2 ac=full",
    ],
    4: [
        "ddp",
        "fsdp2",
        "fsdp2 replicate=2",
        "zero stage=2",
        "zero3",
        "tp",
        "tp sp=false",
        "fsdp2_tp tp=2",
        "pp",
        "pp schedule=1f1b",
    ],
}
CASES = [(w, s) for w in (2, 4) for s in SPECS[w]]


@pytest.mark.parametrize("world,spec", CASES, ids=[f"w{w}-{s.replace(' ', '_')}" for w, s in CASES])
def test_matches_single_rank_fp32(world, spec, request):
    ranks = request.getfixturevalue(f"ranks{world}")
    results = ranks.apply(train_on_rank, spec)
    _assert_losses(results, rel=1e-5)
    lay = results[0]["layout"]
    assert lay["version"] == 1 and lay["world_size"] == world
    assert [r["layout"]["rank"] for r in results] == list(range(world))
    assert lay["path"] == ("deepspeed" if spec.startswith("zero") else "native")
    assert lay["param_bytes_global"] == results[-1]["layout"]["param_bytes_global"]
    for r in results:  # the layout agrees with the tensors themselves
        assert r["layout"]["param_bytes_local"] == r["tensor_bytes"]
    if spec == "fsdp2_tp tp=2":
        assert lay["mesh"] == {"shape": [world // 2, 2], "dim_names": ["dp_shard", "tp"]}


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("spec", ["fsdp2", "zero3"])
def test_sharded_param_bytes_are_one_over_world(world, spec, request):
    ranks = request.getfixturevalue(f"ranks{world}")
    results = ranks.apply(train_on_rank, spec, steps=1)
    glob = results[0]["layout"]["param_bytes_global"]
    assert glob == 4 * sum(torch.Size(e["global_shape"]).numel() for e in results[0]["layout"]["params"])
    for r in results:
        local = r["layout"]["param_bytes_local"]
        assert local == r["tensor_bytes"]
        assert glob / world * 0.95 <= local <= glob / world * 1.05, (local, glob, world)
    assert sum(r["tensor_bytes"] for r in results) == pytest.approx(glob, rel=0.02)


def test_bf16_fsdp2_within_documented_bound(ranks2):
    results = ranks2.apply(train_on_rank, "fsdp2 dtype=bf16")
    _assert_losses(results, rel=2e-2)
    assert results[0]["layout"]["params"][0]["dtype"] == "float32"  # fp32 master shards


@pytest.mark.parametrize("sp", [True, False])
def test_tp_forward_equals_unsharded(sp, ranks4):
    replies = ranks4.apply(tp_forward_on_rank, sp)
    for err, _ in replies:
        assert err < 1e-5
    placements = replies[-1][1]
    assert ["Shard(0)"] in placements  # column-parallel weights are row-sharded tensors


def test_gpipe_and_1f1b_agree(ranks2):
    a = ranks2.apply(train_on_rank, "pp schedule=gpipe", steps=5)
    b = ranks2.apply(train_on_rank, "pp schedule=1f1b", steps=5)
    for ra, rb in zip(a, b):
        assert ra["losses"] == pytest.approx(rb["losses"], rel=1e-6)
    assert a[0]["layout"]["params"][0]["placements"] == ["Stage(0)"]
    assert a[1]["layout"]["params"][0]["placements"] == ["Stage(1)"]


def test_invalid_specs_refused_before_ranks_change(ranks4):
    texts = ["fsdp2_tp tp=3", "tp", "pp", "ddp dtype=fp16", "fsdp2 replicate=3", "zero3 offload"]
    rows = ranks4.apply(invalid_specs_on_rank, texts)
    for messages, model_unchanged, groups_unchanged in rows:
        assert all(m is not None for m in messages), messages
        assert model_unchanged and groups_unchanged
    assert len({tuple(r[0]) for r in rows}) == 1  # same message on every rank
    assert "sizes that fit" in rows[0][0][0] and "n_kv_heads=2" in rows[0][0][1]


def test_switch_ddp_fsdp2_tp_on_the_same_ranks(ranks2):
    rows = ranks2.apply(switch_on_rank, ["ddp", "fsdp2", "tp"])
    ref = reference_losses()[:3]
    for row in rows:
        assert [k for k, _ in row] == ["ddp", "fsdp2", "tp"]
        for _, losses in row:
            assert losses == pytest.approx(ref, rel=1e-5)


def test_fsdp2_no_grad_trap_is_caught(ranks2):
    for unsharded, caught, loss, expected in ranks2.apply(no_grad_trap_on_rank):
        assert unsharded
        assert caught is not None and "torch.no_grad()" in caught and "prepare(model, lambda params" in caught
        assert loss == pytest.approx(expected, rel=1e-5)  # the trap changed no weight


def test_moe_expert_parallel_matches_dense_routing(ranks2):
    for err, w1_shape, grads_ok in ranks2.apply(moe_expert_parallel_on_rank):
        assert err < 1e-5 and grads_ok
        assert w1_shape[0] == 2  # 4 experts over 2 ranks


def ddp_buffer_sync_on_rank() -> tuple:
    from workbench.models import GPT, GPTConfig
    from workbench.strategies import prepare

    model = GPT(GPTConfig.tiny())
    prepared = prepare(model, lambda p: torch.optim.SGD(p, lr=0.1), "ddp")
    try:
        return prepared.model.will_sync_module_buffers(), [n for n, _ in model.named_buffers()]
    finally:
        prepared.close()


def test_ddp_does_not_broadcast_the_rope_table_every_step(ranks2):
    """The GPT's rope table is a constant each rank computes alike: DDP leaves it out of the
    buffer broadcast it otherwise runs before every forward (the losses still match a single
    rank: ``test_matches_single_rank_fp32``)."""
    assert ranks2.apply(ddp_buffer_sync_on_rank) == [(False, ["rope"])] * 2


def groups_after_each_prepare(spec_text: str, runs: int):
    """On a rank: train ``spec_text`` ``runs`` times; after each, the process groups alive and
    gloo's loop threads in this process (one per gloo group, each waking 100 times a second)."""
    import os

    import torch.distributed as dist

    def loops() -> int:
        n = 0
        for tid in os.listdir("/proc/self/task"):
            with open(f"/proc/self/task/{tid}/comm") as f:
                n += f.read().startswith("gloo_tcp_loop")
        return n

    out = []
    for _ in range(runs):
        losses = train_on_rank(spec_text, steps=2)["losses"]
        out.append((len(dist.distributed_c10d._world.pg_names), loops(), losses))
    return out


def test_preparing_a_2d_layout_again_reuses_its_groups(ranks4):
    """A re-run training cell prepares the same layout again: its mesh's sub-groups are
    reused, not created anew (each would be a gloo thread for the life of the ranks)."""
    rows = ranks4.apply(groups_after_each_prepare, "fsdp2_tp tp=2", 3)
    for row in rows:
        (groups, loops, losses), *again = row
        assert [(g, n) for g, n, _ in again] == [(groups, loops)] * 2, row
        assert all(l2 == pytest.approx(losses, rel=1e-6) for _, _, l2 in again)
