"""Rank-side code for tests/ranks/test_layout_models.py: models of every shape (a user model
with ``.blocks``, a nested one, one without blocks, tiny random-init transformers Llama and
GPT-2), a hand-written training loop, and the probes the tests assert on.

Importable by the ranks (the rank sets put ``tests/`` on their ``sys.path``). Nothing here
downloads anything: the transformers models are built from configs.
"""

from __future__ import annotations

import torch
from torch import nn

VOCAB, SEQ, BATCH, LR, STEPS = 128, 16, 8, 1e-2, 3


# ------------------------------------------------------------------ models
class MLPBlock(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 2 * dim)
        self.down = nn.Linear(2 * dim, dim)

    def forward(self, x):
        return x + self.down(torch.relu(self.up(self.norm(x))))


class BlocksNet(nn.Module):
    """A user's model: blocks in ``self.blocks`` (not ``.layers``), token in, logits out."""

    def __init__(self, dim: int = 32, n: int = 4):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.blocks = nn.ModuleList(MLPBlock(dim) for _ in range(n))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, x):
        h = self.embed(x)
        for b in self.blocks:
            h = b(h)
        return self.head(h)


class Stage(nn.Module):
    def __init__(self, dim: int, n: int):
        super().__init__()
        self.units = nn.ModuleDict({f"u{i}": MLPBlock(dim) for i in range(n)})

    def forward(self, x):
        for u in self.units.values():
            x = u(x)
        return x


class NestedNet(nn.Module):
    """Blocks two levels down, in a ModuleDict inside a Sequential."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.trunk = nn.Sequential(nn.Linear(dim, dim), Stage(dim, 3))
        self.head = nn.Linear(dim, VOCAB)

    def forward(self, x):
        return self.head(self.trunk(self.embed(x)))


class FlatNet(nn.Module):
    """No repeated blocks anywhere: FSDP2 must be told what to wrap."""

    def __init__(self, dim: int = 32):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, dim)
        self.mix = nn.Linear(dim, 3 * dim)
        self.head = nn.Linear(3 * dim, VOCAB)

    def forward(self, x):
        return self.head(torch.relu(self.mix(self.embed(x))))


def llama(**over):
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=VOCAB,
        max_position_embeddings=64,
        tie_word_embeddings=False,
    )
    cfg = LlamaConfig(**{**kw, **over})
    return LlamaForCausalLM(cfg)


def gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    cfg = GPT2Config(n_embd=64, n_layer=4, n_head=4, vocab_size=VOCAB, n_positions=64, bos_token_id=0, eos_token_id=0)
    return GPT2LMHeadModel(cfg)


MODELS = {
    "blocks": BlocksNet,
    "nested": NestedNet,
    "flat": FlatNet,
    "llama": llama,
    "gpt2": gpt2,
    "llama_mha": lambda: llama(num_key_value_heads=4),
}  # 4 kv heads: tp=4 splits them


def build(name: str, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return MODELS[name]()


def batch(step: int, dp_rank: int = 0, dp_size: int = 1):
    g = torch.Generator().manual_seed(100 + step % 2)  # two batches, seen again: the loss falls
    t = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=g)
    per = BATCH // dp_size
    t = t[dp_rank * per : (dp_rank + 1) * per]
    return t[:, :-1], t[:, 1:]


# ------------------------------------------------------------------ training
def reference_losses(name: str, steps: int = STEPS) -> list[float]:
    """One process, no parallelism: the losses every layout must reproduce."""
    from workbench.strategies import lm_loss

    model = build(name)
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out = []
    for step in range(steps):
        x, y = batch(step)
        loss = lm_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _train(p, steps: int) -> list[float]:
    """A hand-written loop: forward, loss, backward, step (the pipeline through its schedule)."""
    from workbench.strategies import lm_loss
    from workbench.strategies.base import all_reduce_mean
    from workbench.strategies.pipeline import PipelinePrepared

    losses = []
    for step in range(steps):
        x, y = batch(step, p.dp_rank, p.dp_size)
        if isinstance(p, PipelinePrepared):
            losses.append(p.train_step((x, y)))
            continue
        p.model.train()
        p.optimizer.zero_grad(set_to_none=True)
        loss = lm_loss(p.model(x), y)
        loss.backward()
        p.optimizer.step()
        losses.append(float(all_reduce_mean(loss.detach(), p.loss_group)))
    return losses


USER_TP_PLAN = {"blocks.*.up": "colwise", "blocks.*.down": "rowwise"}


def train_specs(name: str, specs: list[str], steps: int = STEPS, **kwargs) -> dict:
    """Each spec on a fresh model from the same seed: ``{spec: (losses, layout summary)}``.
    ``kwargs`` go to prepare for the specs with tp (``tp_plan=``)."""
    from workbench.strategies import prepare, reset_accelerate_state

    out = {}
    for spec in specs:
        kw = kwargs if "tp" in spec else {}
        p = prepare(build(name), lambda ps: torch.optim.AdamW(ps, lr=LR), spec, **kw)
        try:
            lay = p.layout
            out[spec] = (
                _train(p, steps),
                {
                    "strategy": lay["strategy"],
                    "mesh": lay["mesh"],
                    "degrees": lay["degrees"],
                    "blocks": lay["blocks"],
                    "placements": {e["name"]: e["placements"] for e in lay["params"]},
                    "local": lay["param_bytes_local"],
                    "global": lay["param_bytes_global"],
                },
            )
        finally:
            p.close()
            reset_accelerate_state()
    return out


# ------------------------------------------------------------------ probes
def wrapping(name: str, spec: str, blocks=None) -> dict:
    """Which modules FSDP2 wrapped, which checkpoint and which compile, after prepare."""
    from torch.distributed.fsdp import FSDPModule

    from workbench.strategies import prepare

    model = build(name)
    p = prepare(model, lambda ps: torch.optim.AdamW(ps, lr=LR), spec, blocks=blocks)
    mods = dict(model.named_modules())
    out = {
        "blocks": p.layout["blocks"],
        "fsdp": sorted(n for n, m in mods.items() if isinstance(m, FSDPModule)),
        "checkpointed": sorted(n for n, m in mods.items() if getattr(m, "_workbench_checkpointed", False)),
        "compiled": sorted(n for n, m in mods.items() if n and getattr(m, "_compiled_call_impl", None) is not None),
        "notes": p.layout["notes"],
    }
    if "compile" not in spec:
        out["loss"] = _train(p, 1)[0]
    p.close()
    return out


def tp_forward(spec: str, name: str = "llama") -> float:
    """Max |logits - unsharded logits| of the HF Llama under a tensor-parallel layout."""
    import copy

    from workbench.strategies import prepare

    model = build(name)
    ref = copy.deepcopy(model)
    x, _ = batch(7)
    with torch.no_grad():
        want = ref(x).logits
    p = prepare(model, lambda ps: torch.optim.SGD(ps, lr=0.1), spec)
    with torch.no_grad():
        got = p.model(x).logits  # every rank the whole batch: compare the full logits
    err = float((got.float() - want).abs().max())
    p.close()
    return err


BAD = [  # (model, spec, prepare kwargs, words the message must contain)
    ("llama", "tp", {}, ["num_key_value_heads=2", "use tp in [2]"]),
    ("blocks", "fsdp2", {"blocks": ["NoSuchBlock"]}, ["matches no submodule", "MLPBlock"]),
    ("blocks", "fsdp2 tp=2", {"tp_plan": {"blocks.*.nope": "colwise"}}, ["'blocks.*.nope'", "matches no module"]),
    ("blocks", "pp=2 dp_shard=3", {}, ["6 ranks, but the world has 4"]),
    ("flat", "fsdp2", {}, ["no blocks found", "mix (Linear", "blocks="]),
    ("blocks", "tp", {}, ["no tensor-parallel plan", "tp_plan="]),
    ("gpt2", "pp", {}, ["cannot split GPT2LMHeadModel"]),
    ("blocks", "fsdp2 tp=2", {"tp_plan": {"blocks.*.up": "diagonal"}}, ["'diagonal'", "colwise"]),
]


def bad_inputs() -> dict:
    """Every bad input on one model per case: the message, the model untouched, no new
    process groups; then a good prepare on the same ranks trains."""
    import torch.distributed as dist

    from workbench.strategies import PrepareError, SpecError, prepare

    def groups():
        return len(dist.distributed_c10d._world.pg_names)

    n_groups = groups()
    rows = []
    for name, spec, kw, _ in BAD:
        model = build(name)
        before = {n: (id(q), q.detach().clone()) for n, q in model.named_parameters()}
        mods_before = [n for n, _ in model.named_modules()]
        try:
            prepare(model, lambda ps: torch.optim.AdamW(ps, lr=LR), spec, **kw)
            msg = None
        except (SpecError, PrepareError) as e:
            msg = str(e)
        same = all(id(q) == before[n][0] and torch.equal(q, before[n][1]) for n, q in model.named_parameters())
        same = same and [n for n, _ in model.named_modules()] == mods_before
        same = same and not getattr(model, "_workbench_prepared", None)
        rows.append((msg, same))
    untouched_groups = groups() == n_groups
    after = train_specs("llama", ["fsdp2"], steps=1)["fsdp2"][0]
    return {"rows": rows, "groups": untouched_groups, "after": after}
