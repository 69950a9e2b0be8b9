"""Rank-side code for tests/test_context_parallel.py: context parallel on the workbench GPT
and a tiny random-init transformers Llama, against the same model on one process.

Every rank computes the one-process reference itself (same seed, the whole batch), so a
rank compares its gathered gradients with numbers it made, not with a stored copy.
"""

from __future__ import annotations

import layout_ranks as L
import torch

SEQ, BATCH, LR, STEPS = 16, 4, 1e-2, 3


def gpt():
    from workbench.models import GPT, GPTConfig

    return GPT(GPTConfig(vocab=L.VOCAB, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=64))


def llama():
    return L.llama(num_hidden_layers=2)


MODELS = {"gpt": gpt, "llama": llama}


def build(name: str, seed: int = 0):
    torch.manual_seed(seed)
    return MODELS[name]()


def batch(step: int, dp_rank: int = 0, dp_size: int = 1, hf: bool = False, seq: int = SEQ):
    """``(x, y)``; ``hf``: the targets transformers' own shift makes of ``labels=x`` (the
    last position ignored, so cp ranks hold different numbers of labelled tokens)."""
    g = torch.Generator().manual_seed(200 + step % 2)
    t = torch.randint(0, L.VOCAB, (BATCH, seq + 1), generator=g)
    per = BATCH // dp_size
    t = t[dp_rank * per : (dp_rank + 1) * per]
    x, y = t[:, :-1], t[:, 1:]
    if hf:
        y = torch.cat([x[:, 1:], torch.full_like(x[:, :1], -100)], dim=1)
    return x, y


def _logits(out):
    return getattr(out, "logits", out)


def reference(name: str, steps: int = STEPS, hf: bool = False, seq: int = SEQ):
    """One process: the first step's loss and gradients, and the losses of ``steps`` steps."""
    from workbench.strategies import lm_loss

    model = build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], None
    for step in range(steps):
        x, y = batch(step, hf=hf, seq=seq)
        loss = lm_loss(_logits(model(x)), y)
        opt.zero_grad()
        loss.backward()
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, grads


def parity(name: str, spec: str, steps: int = STEPS, dict_batches: bool = False, seq: int = SEQ) -> dict:
    """Under ``spec``: the first step's loss and every gathered gradient against the
    reference (max relative error), then the losses of ``steps`` train steps (sequences of
    ``seq`` tokens)."""
    from torch.distributed.tensor import DTensor

    from workbench.strategies import prepare, reset_accelerate_state
    from workbench.strategies.base import all_reduce_mean

    want_losses, want_grads = reference(name, steps, hf=dict_batches, seq=seq)
    p = prepare(build(name), lambda ps: torch.optim.AdamW(ps, lr=LR), spec)
    try:

        def make(step):
            x, y = batch(step, p.dp_rank, p.dp_size, hf=dict_batches, seq=seq)
            return {"input_ids": x, "labels": x} if dict_batches else (x, y)

        p.model.train()
        p.optimizer.zero_grad(set_to_none=True)
        loss = p.loss(make(0))
        loss.backward()
        loss0 = float(all_reduce_mean(loss.detach(), p.loss_group))
        worst, worst_name = 0.0, None
        for n, q in p.model.named_parameters():
            g = q.grad.full_tensor() if isinstance(q.grad, DTensor) else q.grad
            w = want_grads[n]
            err = float((g - w).abs().max() / w.abs().max().clamp(min=1e-12))
            if err > worst:
                worst, worst_name = err, n
        p.optimizer.zero_grad(set_to_none=True)
        losses = [p.train_step(make(step)) for step in range(steps)]
        return {
            "loss0": loss0,
            "want0": want_losses[0],
            "grad_err": worst,
            "grad_worst": worst_name,
            "losses": losses,
            "want": want_losses,
            "notes": p.layout["notes"],
            "mesh": p.layout["mesh"],
            "degrees": p.layout["degrees"],
        }
    finally:
        p.close()
        reset_accelerate_state()


def parities(cases: list, keep_notes: bool = False) -> list[dict]:
    """``parity`` for each ``(model, spec, dict_batches[, seq])``, notes dropped unless asked
    for (then joined into one string)."""
    out = []
    for name, spec, as_dict, *seq in cases:
        r = parity(name, spec, dict_batches=as_dict, seq=seq[0] if seq else SEQ)
        notes = r.pop("notes")
        if keep_notes:
            r["notes"] = " | ".join(notes)
        out.append(r)
    return out


BAD = [  # (model, spec, words the message must contain)
    ("blocks", "cp=2", ["context parallel (cp=2)", "BlocksNet", "ALL_ATTENTION_FUNCTIONS", "cp=1"]),
    ("gpt", "ddp cp=2", ["kind='ddp' with cp=2", "fsdp2 cp=2"]),
    ("gpt", "pp=2 cp=2", ["pipeline parallel is not supported"]),
]


def bad_inputs() -> dict:
    """Refused prepares leave the model and the process groups as they were; on a prepared
    cp model a sequence longer than the model's positions once padded to 2 x cp chunks, and
    a direct ``model(x)``, are refused before any parameter changes; then a good step trains."""
    import torch.distributed as dist

    from workbench.strategies import PrepareError, SpecError, prepare

    def groups():
        return len(dist.distributed_c10d._world.pg_names)

    n_groups = groups()
    rows = []
    for name, spec, _ in BAD:
        model = L.build(name) if name in L.MODELS else build(name)
        before = {n: q.detach().clone() for n, q in model.named_parameters()}
        try:
            prepare(model, lambda ps: torch.optim.AdamW(ps, lr=LR), spec)
            msg = None
        except (SpecError, PrepareError) as e:
            msg = str(e)
        same = all(torch.equal(q, before[n]) for n, q in model.named_parameters())
        rows.append((msg, same and not getattr(model, "_workbench_prepared", None)))
    untouched_groups = groups() == n_groups

    p = prepare(build("gpt"), lambda ps: torch.optim.AdamW(ps, lr=LR), "cp=2")
    local = {n: q.to_local().detach().clone() for n, q in p.model.named_parameters()}
    steps = []
    for bad in (
        lambda: p.train_step(batch(0, p.dp_rank, p.dp_size, seq=65)),
        lambda: p.model(batch(0, p.dp_rank, p.dp_size)[0]),
    ):
        try:
            bad()
            steps.append(None)
        except PrepareError as e:
            steps.append(str(e))
    same = all(torch.equal(q.to_local(), local[n]) for n, q in p.model.named_parameters())
    after = p.train_step(batch(0, p.dp_rank, p.dp_size, seq=63, hf=True))  # pads to 64, the model's positions
    p.close()
    return {"rows": rows, "groups": untouched_groups, "steps": steps, "same": same, "after": after}


def layout_of(spec: str) -> dict:
    """Placements (by the layout's mesh dims) and holds of two GPT weights under ``spec``."""
    from workbench.strategies import prepare

    p = prepare(build("gpt"), lambda ps: torch.optim.AdamW(ps, lr=LR), spec)
    try:
        want = ("layers.0.attention.wq.weight", "norm.weight")
        return {
            "mesh": p.layout["mesh"],
            **{e["name"]: (e["placements"], e["holds"]) for e in p.layout["params"] if e["name"] in want},
        }
    finally:
        p.close()
