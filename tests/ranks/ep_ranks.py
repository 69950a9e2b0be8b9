"""Rank-side code for tests/ranks/test_expert_parallel.py: ``prepare(..., "ep=N")`` on the
workbench MoEGPT against the same model on one process, and against the same layout
without ep.

Against one process the MoE config drops no token (``capacity_factor = n_experts /
top_k``: an expert has room for every token) and has no auxiliary loss: both depend on
which tokens share a rank, so data parallel changes them by design, with or without ep.
Against ``fsdp2`` without ep the default config (dropping, auxiliary loss) is used.

``model="qwen3"``: a tiny random-init transformers ``Qwen3MoeForCausalLM`` (fused experts,
4 of them, top-2; no router auxiliary loss), built from a config, nothing downloaded.
"""

from __future__ import annotations

import torch

VOCAB, SEQ, BATCH, LR, STEPS = 64, 16, 8, 1e-2, 3
EXACT = dict(capacity_factor=2.0, aux_loss_coef=0.0)  # 4 experts, top-2: room for every token


def build(seed: int = 0, model: str = "gpt", **over):
    from workbench.models import GPTConfig, MoEConfig, MoEGPT

    torch.manual_seed(seed)
    if model == "qwen3":
        return qwen3_moe(**over)
    if model == "mixtral":
        return mixtral(**over)
    gpt = GPTConfig.tiny(vocab=VOCAB, max_seq_len=SEQ)
    return MoEGPT(MoEConfig(gpt=gpt, n_experts=4, top_k=2, **over))


def qwen3_moe(**over):
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    kw = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        moe_intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        num_experts=4,
        num_experts_per_tok=2,
        norm_topk_prob=True,
        max_position_embeddings=64,
    )
    return Qwen3MoeForCausalLM(Qwen3MoeConfig(**{**kw, **over}))


def mixtral(**over):
    from transformers import MixtralConfig, MixtralForCausalLM

    kw = dict(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_local_experts=4,
        num_experts_per_tok=2,
        max_position_embeddings=64,
    )
    return MixtralForCausalLM(MixtralConfig(**{**kw, **over}))


EXPERT = {
    "gpt": "layers.0.feed_forward.w1",
    "qwen3": "model.layers.0.mlp.experts.gate_up_proj",
    "mixtral": "model.layers.0.mlp.experts.gate_up_proj",
}


def batch(step: int, dp_rank: int = 0, dp_size: int = 1):
    g = torch.Generator().manual_seed(300 + step % 2)
    t = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    per = BATCH // dp_size
    t = t[dp_rank * per : (dp_rank + 1) * per]
    return t[:, :-1], t[:, 1:]


def reference(steps: int = STEPS, model: str = "gpt", **over):
    """One process, the whole batch: every step's loss and the first step's gradients."""
    from workbench.strategies import lm_loss

    model = build(model=model, **over)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, grads = [], None
    for step in range(steps):
        x, y = batch(step)
        loss = lm_loss(model(x), y)
        if hasattr(model, "aux_loss"):  # the MoEGPT's, of this forward (transformers: none without router logits)
            loss = loss + model.aux_loss()
        opt.zero_grad()
        loss.backward()
        if grads is None:
            grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        opt.step()
        losses.append(loss.item())
    return losses, grads


def run(spec: str, steps: int = STEPS, exact: bool = True, model: str = "gpt") -> dict:
    """Train ``steps`` steps under ``spec``; the first step's gradients (gathered) against
    the one-process ones when ``exact``; each expert weight's local shape and placements."""
    from torch.distributed.tensor import DTensor

    from workbench.strategies import prepare

    over = EXACT if exact and model == "gpt" else {}
    want, grads = reference(steps, model, **over) if exact else (None, None)
    p = prepare(build(model=model, **over), lambda ps: torch.optim.AdamW(ps, lr=LR), spec)
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
        w1 = p.unwrap().get_parameter(EXPERT[model])
        entry = next(e for e in p.layout["params"] if e["name"] == EXPERT[model])
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


class ListedExperts(torch.nn.Module):
    """A user's MoE whose experts are separate modules in a list (not stacked weights)."""

    def __init__(self, dim: int = 16, n: int = 4):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, dim)
        self.router = torch.nn.Linear(dim, n)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(dim, dim) for _ in range(n))
        self.head = torch.nn.Linear(dim, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        pick = self.router(h).argmax(-1, keepdim=True)
        return self.head(sum(e(h) * (pick == i) for i, e in enumerate(self.experts)))


def bad_inputs() -> dict:
    """``ep=2`` on a model with no experts, on one whose experts were already split by hand,
    on one whose experts are a list of modules, and on a transformers MoE with 3 experts:
    each refused, the model unchanged; then ``ep=2`` prepares of both MoE models train."""
    import layout_ranks as L

    from workbench.models import expert_parallel
    from workbench.strategies import PrepareError, prepare

    refused = []
    cases = (L.build("blocks"), expert_parallel(build()), ListedExperts(), build(model="qwen3", num_experts=3))
    for model in cases:
        before = {n: (id(q), q.detach().clone()) for n, q in model.named_parameters()}
        forwards = [n for n, m in model.named_modules() if "forward" in vars(m)]
        try:
            prepare(model, lambda ps: torch.optim.AdamW(ps, lr=LR), "ep=2")
            msg = None
        except PrepareError as e:
            msg = str(e)
        same = all(id(q) == before[n][0] and torch.equal(q, before[n][1]) for n, q in model.named_parameters())
        same = same and forwards == [n for n, m in model.named_modules() if "forward" in vars(m)]
        refused.append((msg, same and not getattr(model, "_workbench_prepared", None)))
    after = []
    for name in ("gpt", "qwen3"):
        p = prepare(build(model=name), lambda ps: torch.optim.AdamW(ps, lr=LR), "ep=2")
        try:
            after.append(p.train_step(batch(0, p.dp_rank, p.dp_size)))
        finally:
            p.close()
    return {"refused": refused, "after": after}


# ------------------------------------------------------------------ checkpoints
_CK: dict = {}  # what the checkpoint tests keep on a rank between calls


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.detach().full_tensor() if hasattr(t, "full_tensor") else t.detach().clone()


def ck_build(spec: str, model: str = "gpt", seed: int = 0) -> dict:
    """A fresh model (``seed``) prepared under ``spec`` and tracked for checkpoints."""
    from workbench.engine import checkpoint_hooks as ch
    from workbench.strategies import prepare

    ck_clean()
    over = EXACT if model == "gpt" else {}
    p = prepare(build(seed, model, **over), lambda ps: torch.optim.AdamW(ps, lr=LR), spec)
    _CK.update(p=p, state=ch.track(p), losses={})
    return p.layout["mesh"]


def ck_train(n: int) -> dict:
    """``n`` steps from the tracked step on (the data of step ``s`` is ``batch(s)``): {step: loss}."""
    from workbench.engine import checkpoint_hooks as ch

    p, st = _CK["p"], _CK["state"]
    for _ in range(n):
        s = st.step
        _CK["losses"][s] = p.train_step(batch(s, p.dp_rank, p.dp_size))
        ch.step_done(_CK["losses"][s])
    return dict(_CK["losses"])


LOGITS_X = torch.arange(2 * SEQ).view(2, SEQ) * 7 % VOCAB


def ck_live() -> tuple[dict, torch.Tensor]:
    """Every parameter gathered whole, and the logits of ``LOGITS_X`` (eval mode)."""
    model = _CK["p"].unwrap()
    values = {n: _full(q) for n, q in model.named_parameters()}
    model.eval()
    try:
        with torch.no_grad():
            out = model(LOGITS_X)
    finally:
        model.train()
    return values, _full(getattr(out, "logits", out))


def ck_clean() -> bool:
    from workbench.engine import checkpoint_hooks as ch
    from workbench.engine.checkpoint import save

    save.wait()
    ch.untrack()
    if "p" in _CK:
        _CK["p"].close()
    _CK.clear()
    return True


def one_process_load(folder: str, steps: int = 2) -> dict:
    """A plain model on one process (no process group) loads ``folder`` with the engine's own
    load; its parameters, the logits of ``LOGITS_X`` and the next ``steps`` losses (whole batch)."""
    from workbench.engine.checkpoint.load import load
    from workbench.engine.checkpoint.state import Target, TrainState
    from workbench.strategies import lm_loss

    model = build(1, **EXACT)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    target = Target(model=model, optimizer=opt, state=TrainState())
    info = load(target, folder)
    values = {n: q.detach().clone() for n, q in model.named_parameters()}
    with torch.no_grad():
        logits = model.eval()(LOGITS_X)
    model.train()
    losses = {}
    for s in range(target.state.step, target.state.step + steps):
        x, y = batch(s)
        loss = lm_loss(model(x), y) + model.aux_loss()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[s] = loss.item()
    return {"info": info, "values": values, "logits": logits, "losses": losses}


# ------------------------------------------------------------------ HF weights in, the trainer
def hf_batch(step: int, dp_rank: int = 0, dp_size: int = 1) -> dict:
    x, _ = batch(step, dp_rank, dp_size)
    return {"input_ids": x, "labels": x}  # transformers shifts the labels itself


def pretrained_then_trainer(folder: str, spec: str = "ep=2", steps: int = STEPS) -> dict:
    """Rank 0 writes a Qwen3-MoE with ``save_pretrained`` (experts one at a time in the file);
    a model from another seed, laid out under ``spec``, reads it with ``load_pretrained`` and
    ``engine.Trainer`` trains it on ``{input_ids, labels}`` batches. Against one process
    training the saved model on the whole batch."""
    import torch.distributed as dist

    from workbench.engine import Trainer
    from workbench.engine.checkpoint.pretrained import load_pretrained
    from workbench.strategies import prepare

    if dist.get_rank() == 0:
        build(1, "qwen3").save_pretrained(folder)
    dist.barrier()
    ref = build(1, "qwen3")
    opt = torch.optim.AdamW(ref.parameters(), lr=LR)
    want = []
    for s in range(steps):
        loss = ref(**hf_batch(s)).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        want.append(loss.item())
    p = prepare(build(2, "qwen3"), lambda ps: torch.optim.AdamW(ps, lr=LR), spec)
    try:
        info = load_pretrained(folder, p)
        t = Trainer(p, data=lambda i: hf_batch(i, p.dp_rank, p.dp_size))
        t.start(steps)
        t.wait(300)
        return {"info": info, "state": t.state, "losses": list(t.history), "want": want}
    finally:
        p.close()
