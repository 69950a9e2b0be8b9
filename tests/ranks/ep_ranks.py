"""Rank-side code for tests/ranks/test_expert_parallel.py: ``prepare(..., "ep=N")`` on the
workbench MoEGPT against the same model on one process, and against the same layout
without ep.

Against one process the MoE config drops no token (``capacity_factor = n_experts /
top_k``: an expert has room for every token) and has no auxiliary loss: both depend on
which tokens share a rank, so data parallel changes them by design, with or without ep.
Against ``fsdp2`` without ep the default config (dropping, auxiliary loss) is used.
"""

from __future__ import annotations

import torch

VOCAB, SEQ, BATCH, LR, STEPS = 64, 16, 8, 1e-2, 3
EXACT = dict(capacity_factor=2.0, aux_loss_coef=0.0)  # 4 experts, top-2: room for every token


def build(seed: int = 0, **over):
    from workbench.models import GPTConfig, MoEConfig, MoEGPT

    torch.manual_seed(seed)
    gpt = GPTConfig.tiny(vocab=VOCAB, max_seq_len=SEQ)
    return MoEGPT(MoEConfig(gpt=gpt, n_experts=4, top_k=2, **over))


def batch(step: int, dp_rank: int = 0, dp_size: int = 1):
    g = torch.Generator().manual_seed(300 + step % 2)
    t = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    per = BATCH // dp_size
    t = t[dp_rank * per : (dp_rank + 1) * per]
    return t[:, :-1], t[:, 1:]


def reference(steps: int = STEPS, **over):
    """One process, the whole batch: every step's loss and the first step's gradients."""
    from workbench.strategies import lm_loss

    model = build(**over)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], None
    for step in range(steps):
        x, y = batch(step)
        loss = lm_loss(model(x), y) + model.aux_loss()
        opt.zero_grad()
        loss.backward()
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, grads


def run(spec: str, steps: int = STEPS, exact: bool = True) -> dict:
    """Train ``steps`` steps under ``spec``; the first step's gradients (gathered) against
    the one-process ones when ``exact``; each expert weight's local shape and placements."""
    from torch.distributed.tensor import DTensor

    from workbench.strategies import prepare

    over = EXACT if exact else {}
    want, grads = reference(steps, **over) if exact else (None, None)
    p = prepare(build(**over), lambda ps: torch.optim.AdamW(ps, lr=LR), spec)
    try:
        losses = [p.train_step(batch(0, p.dp_rank, p.dp_size))]
        err, worst = 0.0, None
        if exact:
            for n, q in p.unwrap().named_parameters():
                g = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
                e = float((g - grads[n]).abs().max() / grads[n].abs().max().clamp(min=1e-12))
                if e > err:
                    err, worst = e, n
        losses += [p.train_step(batch(s, p.dp_rank, p.dp_size)) for s in range(1, steps)]
        w1 = p.unwrap().layers["0"].feed_forward.w1
        entry = next(e for e in p.layout["params"] if e["name"] == "layers.0.feed_forward.w1")
        return {
            "losses": losses,
            "want": want,
            "grad_err": err,
            "grad_worst": worst,
            "w1_local": tuple(w1.to_local().shape),
            "w1_mesh": list(w1.device_mesh.mesh_dim_names),
            "w1_placements": entry["placements"],
            "w1_holds": entry["holds"]["runs"][0],
            "mesh": p.layout["mesh"],
            "dp": (p.dp_rank, p.dp_size),
            "notes": p.layout["notes"],
        }
    finally:
        p.close()


def bad_inputs() -> dict:
    """``ep=2`` on a model with no experts, and on one whose experts were already split by
    hand: refused, the model unchanged; then an ``ep=2`` prepare trains."""
    import layout_ranks as L

    from workbench.models import expert_parallel
    from workbench.strategies import PrepareError, prepare

    refused = []
    for model in (L.build("blocks"), expert_parallel(build())):
        before = {n: q.detach().clone() for n, q in model.named_parameters()}
        try:
            prepare(model, lambda ps: torch.optim.AdamW(ps, lr=LR), "ep=2")
            msg = None
        except PrepareError as e:
            msg = str(e)
        same = all(torch.equal(q, before[n]) for n, q in model.named_parameters())
        refused.append((msg, same and not getattr(model, "_workbench_prepared", None)))
    p = prepare(build(), lambda ps: torch.optim.AdamW(ps, lr=LR), "ep=2")
    try:
        after = p.train_step(batch(0, p.dp_rank, p.dp_size))
    finally:
        p.close()
    return {"refused": refused, "after": after}
