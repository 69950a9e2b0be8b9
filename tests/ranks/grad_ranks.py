"""Rank-side code for tests/ranks/test_grad_placements.py: after a train step under a
layout, each parameter's gradient against its parameter (placements, local bytes) and
against the one-process gradient of the same batch (``cp_ranks.reference``)."""

from __future__ import annotations

import cp_ranks as C
import torch


def grad_report(spec: str, steps: int = 2) -> dict:
    """Train ``steps`` steps of the workbench GPT under ``spec``; report the first step's
    gradients (left in ``.grad`` by ``train_step``) and every step's loss."""
    from torch.distributed.tensor import DTensor

    from workbench.strategies import prepare

    want_losses, want_grads = C.reference("gpt", steps)
    p = prepare(C.build("gpt"), lambda ps: torch.optim.AdamW(ps, lr=C.LR), spec)
    try:
        losses = [p.train_step(C.batch(0, p.dp_rank, p.dp_size))]
        rows = {}
        for n, q in p.unwrap().named_parameters():
            g = q.grad
            full = g.full_tensor() if isinstance(g, DTensor) else g
            w = want_grads[n]
            rows[n] = {
                "param": [str(x) for x in q.placements] if isinstance(q, DTensor) else None,
                "grad": [str(x) for x in g.placements] if isinstance(g, DTensor) else None,
                "param_local": tuple((q.to_local() if isinstance(q, DTensor) else q).shape),
                "grad_local": tuple((g.to_local() if isinstance(g, DTensor) else g).shape),
                "err": float((full - w).abs().max() / w.abs().max().clamp(min=1e-12)),
            }
        losses += [p.train_step(C.batch(s, p.dp_rank, p.dp_size)) for s in range(1, steps)]
        return {"rows": rows, "losses": losses, "want": want_losses, "notes": p.layout["notes"]}
    finally:
        p.close()
