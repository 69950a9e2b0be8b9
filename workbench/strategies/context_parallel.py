"""Context parallel: the sequence split over the ``cp`` ranks, attention as a ring
(Liu et al. 2023, "Ring Attention"; torchtitan's ``context_parallel``), in plain torch so it
runs on CPU/gloo ranks.

Not ``torch.distributed.tensor.experimental.context_parallel``: in torch 2.13 it overrides
only the CUDA SDPA kernels, so on CPU attention would run on the local shard alone, silently
wrong. The zig-zag split and the ring, naively: docs/strategies.md."""

from __future__ import annotations

import contextlib
import inspect
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from .base import PrepareError, all_reduce_mean
from .fsdp2 import FSDP2Prepared

__all__ = [
    "CPState",
    "zigzag_index",
    "ring_attention",
    "check_cp_model",
    "apply_cp",
    "guard_direct_calls",
    "recompute_context",
    "HF_IMPL",
    "CPPrepared",
]

HF_IMPL = "workbench_cp"
_MASKED = -1e30  # finite: a fully masked row of one block gets weight exp(-1e30 - lse) = 0, never NaN


def zigzag_index(seq: int, cp: int, rank: int) -> torch.Tensor:
    """Global positions cp rank ``rank`` holds: chunks ``rank`` and ``2cp-1-rank`` of ``2cp``."""
    c = seq // (2 * cp)
    return torch.cat(
        [torch.arange(rank * c, (rank + 1) * c), torch.arange((2 * cp - 1 - rank) * c, (2 * cp - rank) * c)]
    )


@dataclass
class CPState:
    """The cp group as the attention sees it; ``active`` is set only while a prepared step
    runs, so a direct ``model(x)`` call on the full sequence is refused, not silently wrong."""

    group: object
    rank: int
    size: int
    active: bool = False


def _refuse_direct(st: CPState) -> None:
    if not st.active:
        raise PrepareError(
            f"this model is laid out with cp={st.size}: each rank holds a shard of the sequence, so "
            "call it through the prepared object (prepared.train_step(batch) / prepared.loss(batch)), "
            "which shards the batch and passes the positions, not model(x)"
        )


@contextlib.contextmanager
def _active(st: CPState):
    prev, st.active = st.active, True
    try:
        yield
    finally:
        st.active = prev


def recompute_context(st: CPState):
    """``context_fn`` for activation checkpointing: a block recomputed in backward (after
    the prepared step's forward ended) runs its ring attention as the forward did. Every cp
    rank recomputes the same blocks in the same order, so the ring's sends pair up."""
    return lambda: (contextlib.nullcontext(), _active(st))


def guard_direct_calls(model: nn.Module, st: CPState) -> None:
    """Refuse ``model(x)`` outside a prepared step before anything runs (registered after
    FSDP2's hooks and put in front of them, so no parameter is gathered first)."""
    model.register_forward_pre_hook(lambda mod, args: _refuse_direct(st), prepend=True)


class _RingShift(torch.autograd.Function):
    """Send to the next cp rank, receive from the previous; backward: the reverse."""

    @staticmethod
    def forward(ctx, t, state):
        ctx.state = state
        return _shift(t.contiguous(), state, +1)

    @staticmethod
    def backward(ctx, g):
        return _shift(g.contiguous(), ctx.state, -1), None


def _shift(t: torch.Tensor, st: CPState, step: int) -> torch.Tensor:
    dst = dist.get_global_rank(st.group, (st.rank + step) % st.size)
    src = dist.get_global_rank(st.group, (st.rank - step) % st.size)
    out = torch.empty_like(t)
    ops = [dist.P2POp(dist.isend, t, dst, st.group), dist.P2POp(dist.irecv, out, src, st.group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    return out


def _attend_block(q, k, v, pos_q, pos_k, scale):
    """Softmax attention of ``q`` over one key/value block, causal by global position;
    returns the block-normalised output and each row's log-sum-exp."""
    s = torch.matmul(q, k.transpose(-1, -2)) * scale
    s = s.masked_fill(pos_k[None, :] > pos_q[:, None], _MASKED)
    lse = torch.logsumexp(s, dim=-1, keepdim=True)
    return torch.matmul(torch.exp(s - lse), v), lse


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, st: CPState, scale: float | None = None
) -> torch.Tensor:
    """Causal attention of this rank's zig-zag shard ``q, k, v [b, h, s_local, d]`` (same
    heads) over the whole sequence of the cp group; fp32 inside, ``q``'s dtype out."""
    _refuse_direct(st)
    dtype, s_local = q.dtype, q.shape[-2]
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    seq = s_local * st.size
    pos = [zigzag_index(seq, st.size, r).to(q.device) for r in range(st.size)]
    qf = q.float()
    kv = torch.stack([k.float(), v.float()])
    out, lse = _attend_block(qf, kv[0], kv[1], pos[st.rank], pos[st.rank], scale)
    for step in range(1, st.size):
        kv = _RingShift.apply(kv, st)
        src = (st.rank - step) % st.size
        o_b, lse_b = _attend_block(qf, kv[0], kv[1], pos[st.rank], pos[src], scale)
        new = torch.logaddexp(lse, lse_b)
        out = out * torch.exp(lse - new) + o_b * torch.exp(lse_b - new)
        lse = new
    return out.to(dtype)


# ------------------------------------------------------------------ models
def _gpt_attentions(model: nn.Module) -> list[nn.Module]:
    return [m for m in model.modules() if hasattr(m, "attn_fn") and hasattr(m, "head_dim")]


def _hf_attentions(model: nn.Module) -> list[nn.Module]:
    out = []
    for m in model.modules():
        try:
            src = inspect.getsource(type(m).forward)
        except (OSError, TypeError):
            continue
        if "ALL_ATTENTION_FUNCTIONS" in src:
            out.append(m)
    return out


def check_cp_model(model: nn.Module, cp: int) -> str:
    """``"gpt"`` or ``"hf"``: how ring attention goes into this model; else
    :class:`PrepareError` naming what is supported (pure: nothing changes)."""
    if _gpt_attentions(model) and "positions" in inspect.signature(model.forward).parameters:
        return "gpt"
    cfg = getattr(model, "config", None)
    if cfg is not None and _hf_attentions(model) and "position_ids" in inspect.signature(model.forward).parameters:
        return "hf"
    raise PrepareError(
        f"context parallel (cp={cp}) needs to replace {type(model).__name__}'s attention with ring attention, and "
        "cannot here: supported are models whose attention modules have an attn_fn hook and whose forward takes "
        "positions= (workbench.models.GPT), and transformers models whose attention goes through "
        "ALL_ATTENTION_FUNCTIONS and whose forward takes position_ids (Llama family and most recent ones); "
        "use dp_shard / tp for this model, or cp=1"
    )


def _cp_attention_gpt(st: CPState):
    def attn(module, q, k, v):
        return ring_attention(q, k, v, st)

    return attn


def _hf_cp_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """``ALL_ATTENTION_FUNCTIONS["workbench_cp"]``: ring attention over the module's cp
    group; returns ``[b, s, heads, d]`` as transformers' own functions do."""
    st: CPState = module._workbench_cp
    if dropout:
        raise PrepareError(
            f"attention dropout={dropout} with context parallel is not supported; set attention_dropout=0"
        )
    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1:
        key = key.repeat_interleave(groups, dim=1)
        value = value.repeat_interleave(groups, dim=1)
    out = ring_attention(query, key, value, st, scaling)
    return out.transpose(1, 2).contiguous(), None


def apply_cp(model: nn.Module, kind: str, group, notes: list[str]) -> CPState:
    """Put ring attention into every attention module of ``model`` (``kind`` from
    :func:`check_cp_model`); returns the shared :class:`CPState`.

    The workbench GPT through its ``Attention.attn_fn`` hook (rotary rows at the shard's
    global positions); a transformers model through ``ALL_ATTENTION_FUNCTIONS``
    (``"workbench_cp"``, ``position_ids`` giving rotary the global positions). Parameters are
    FSDP2-sharded over ``dp_shard x cp`` (the cp ranks share weights and see different
    tokens), so the gradient reduce-scatter averages over both, as torchtitan does."""
    st = CPState(group=group, rank=dist.get_rank(group), size=dist.get_world_size(group))
    if kind == "gpt":
        mods = _gpt_attentions(model)
        for m in mods:
            m.attn_fn = _cp_attention_gpt(st)
    else:
        from transformers import AttentionInterface

        AttentionInterface.register(HF_IMPL, _hf_cp_attention)
        mods = _hf_attentions(model)
        for m in mods:
            m._workbench_cp = st
        model.config._attn_implementation = HF_IMPL
        for sub in model.modules():
            c = getattr(sub, "config", None)
            if c is not None and hasattr(c, "_attn_implementation"):
                c._attn_implementation = HF_IMPL
    notes.append(
        f"context parallel over {st.size} ranks: sequence in 2x{st.size} zig-zag chunks, ring attention "
        f"(K/V sent round the ring, log-sum-exp merge) in {len(mods)} attention modules; "
        "parameters sharded over dp_shard x cp"
    )
    return st


# ------------------------------------------------------------------ the step
class CPPrepared(FSDP2Prepared):
    """Steps that shard each batch's sequence over the cp group (zig-zag), run the model
    with the shard's global positions, and weight each rank's loss by its share of the
    group's labelled tokens, so the mean over ``dp x cp`` is the global batch's loss.

    Batches: ``(x, y)`` (targets already shifted) or a dict with ``input_ids`` and
    ``labels`` (transformers style: labels shifted here, before the split). A length that
    does not split into ``2 x cp`` chunks is padded (see :meth:`_padded`)."""

    shards_sequence = True  # the trainer calls ``loss(batch)`` inside its own step

    def __init__(self, *, cp_state: CPState, cp_kind: str, **kw):
        super().__init__(**kw)
        self.cp_state, self.cp_kind = cp_state, cp_kind

    def _pair(self, batch):
        if isinstance(batch, dict):
            unknown = set(batch) - {"input_ids", "labels", "attention_mask"}
            if "input_ids" not in batch or "labels" not in batch or unknown:
                raise PrepareError(
                    f"a cp={self.cp_state.size} step takes (x, y) or a dict with input_ids and labels; "
                    f"got keys {sorted(batch)}"
                )
            am = batch.get("attention_mask")
            if am is not None and not bool(torch.as_tensor(am).all()):
                raise PrepareError(
                    "attention_mask with padding is not supported with context parallel; pack "
                    "sequences without padding (or mark padded labels -100 and drop attention_mask)"
                )
            labels = batch["labels"]
            y = torch.cat([labels[:, 1:], torch.full_like(labels[:, :1], -100)], dim=1)
            return batch["input_ids"], y
        x, y = batch
        return x, y

    def _positions(self) -> int | None:
        """How many positions the model has (the workbench GPT's rotary rows, a transformers
        config's ``max_position_embeddings``); None where it does not say."""
        cfg = getattr(self._inner, "cfg", None) if self.cp_kind == "gpt" else getattr(self._inner, "config", None)
        return getattr(cfg, "max_seq_len", None) or getattr(cfg, "max_position_embeddings", None)

    def _padded(self, x: torch.Tensor, y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The zig-zag split needs ``2 x cp`` equal chunks: a sequence that does not divide is
        padded at its end (token 0, label -100). Under the causal mask no real token sees the
        padding and the padding has no loss, so the step is the unpadded one's."""
        chunks = 2 * self.cp_state.size
        seq = x.shape[1]
        pad = -seq % chunks
        limit = self._positions()
        if limit is not None and seq + pad > limit:
            raise PrepareError(
                f"sequence length {seq}"
                + (f" (padded to {seq + pad} for 2 x cp = {chunks} equal zig-zag chunks)" if pad else "")
                + f" is longer than the model's {limit} positions; use a length of at most "
                f"{limit - limit % chunks}"
            )
        if not pad:
            return x, y
        return (
            torch.cat([x, x.new_zeros(x.shape[0], pad)], dim=1),
            torch.cat([y, y.new_full((y.shape[0], pad), -100)], dim=1),
        )

    def loss(self, batch) -> torch.Tensor:
        """This rank's loss term (backward it; the ``dp x cp`` mean is the global loss)."""
        st = self.cp_state
        x, y = self._padded(*(t.to(self.device) for t in self._pair(batch)))
        seq = x.shape[1]
        idx = zigzag_index(seq, st.size, st.rank).to(self.device)
        xl, yl = x[:, idx], y[:, idx]
        st.active = True
        try:
            with self._autocast_ctx():
                if self.cp_kind == "gpt":
                    out = self.model(xl, positions=idx)
                else:
                    # no KV cache: a block recomputed in backward (activation checkpointing)
                    # would append its keys to the cache its first forward filled
                    extra = (
                        {"use_cache": False} if "use_cache" in inspect.signature(self.model.forward).parameters else {}
                    )
                    out = self.model(input_ids=xl, position_ids=idx[None].expand(xl.shape[0], -1), **extra)
        finally:
            st.active = False
        n_local = (yl != -100).sum().float()
        if n_local.item():
            local = self.compute_loss(out, yl)
        else:  # only padding or ignored labels here (the mean would be 0/0): no term, still in the graph
            local = getattr(out, "logits", out).sum() * 0.0
        n_total = n_local.detach().clone()
        dist.all_reduce(n_total, group=st.group)
        return local * (n_local * st.size / n_total.clamp(min=1))

    def train_step(self, batch) -> float:
        self.check()
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        loss = self.loss(batch)
        loss.backward()
        self.optimizer.step()
        self.steps += 1
        return float(all_reduce_mean(loss.detach(), self.loss_group))

    @torch.no_grad()
    def eval_loss(self, batch) -> float:
        return float(all_reduce_mean(self.loss(batch), self.loss_group))
