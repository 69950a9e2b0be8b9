"""Pipeline parallel with ``torch.distributed.pipelining``: each pipeline rank is one stage
owning a contiguous slice of the blocks (stage 0 also the embedding, the last stage the norm
and head), torchtitan style: the stage deletes what it does not own, so parameter names stay
those of the whole model. Schedules: GPipe (Huang et al. 2019) and 1F1B (PipeDream-Flush,
Narayanan et al. 2021), which compute the same gradients."""

from __future__ import annotations

import time
import types

import torch
import torch.distributed as dist
from torch import nn

from .base import Prepared, PrepareError, all_reduce_mean

__all__ = ["PipelinePrepared", "split_points", "check_splittable", "keep_stage", "make_schedule", "schedule_order"]


def schedule_order(schedule, stage_idx: int) -> list[list]:
    """torch's description of the schedule's compute on this stage (``pipeline_order``, idle
    slots and gradient reductions left out): ``[["F" | "B", microbatch], ...]``.

    Kept beside what ran, not trusted for it: in torch 2.13 ``Schedule1F1B``'s description
    of the last stage starts at micro-batch 1 and ends at micro-batch m (which does not
    exist), while ``_step_microbatches`` runs 0..m-1 correctly.
    """
    order = getattr(schedule, "pipeline_order", None) or {}
    out = []
    for action in order.get(stage_idx, []):
        if action is None or action.microbatch_index is None:
            continue
        kind = action.computation_type.value
        if kind in ("F", "B"):
            out.append([kind, int(action.microbatch_index)])
    return out


def split_points(keys: list[str], n_stages: int, boundaries: list[int] | None = None) -> list[list[str]]:
    """Block keys per stage: even by count (the first stages take the extra blocks), or cut
    before the block indices in ``boundaries`` (``[2]``: stage 0 = blocks 0-1, stage 1 = the rest)."""
    n = len(keys)
    if not 1 <= n_stages <= n:
        raise PrepareError(f"pp={n_stages} pipeline stages for {n} blocks: each stage needs a block; use pp <= {n}")
    if boundaries is not None:
        cuts = list(boundaries)
        if len(cuts) != n_stages - 1 or cuts != sorted(set(cuts)) or not all(0 < c < n for c in cuts):
            raise PrepareError(
                f"pp_boundaries={cuts!r}: give {n_stages - 1} increasing block indices in 1..{n - 1} "
                f"(where stages 1..{n_stages - 1} start), e.g. {[n * (i + 1) // n_stages for i in range(n_stages - 1)]}"
            )
        edges = [0] + cuts + [n]
        return [keys[edges[i] : edges[i + 1]] for i in range(n_stages)]
    base, extra = divmod(n, n_stages)
    out, start = [], 0
    for s in range(n_stages):
        k = base + (1 if s < extra else 0)
        out.append(keys[start : start + k])
        start += k
    return out


def _hf_parts(model: nn.Module):
    """``(decoder, layers)`` of a transformers causal LM of the Llama family, else ``None``."""
    prefix = getattr(model, "base_model_prefix", None)
    base = getattr(model, prefix, None) if prefix else None
    if base is None or getattr(model, "lm_head", None) is None:
        return None
    if not all(isinstance(getattr(base, a, None), nn.Module) for a in ("embed_tokens", "layers", "norm", "rotary_emb")):
        return None
    return base, base.layers


def check_splittable(model: nn.Module, pp: int, boundaries=None) -> list[list[str]]:
    """Refuse, before any rank changes, a model this module cannot split into ``pp`` stages.

    Two kinds split: models with ``keep_stage(stage, n_stages)`` (the workbench GPT) and
    transformers causal LMs of the Llama family (``model.embed_tokens``, ``model.layers``,
    ``model.norm``, ``model.rotary_emb``, ``lm_head``); anything else is refused, naming why."""
    if hasattr(model, "keep_stage") and hasattr(model, "layers"):
        return split_points(list(model.layers.keys()), pp, boundaries)
    parts = _hf_parts(model)
    if parts is None:
        raise PrepareError(
            f"pipeline parallel cannot split {type(model).__name__}: it needs a decoder whose forward is "
            "embedding -> blocks -> norm -> head. Supported: models with keep_stage(stage, n_stages) "
            "(see workbench.models.GPT) and transformers causal LMs of the Llama family (model.embed_tokens, "
            "model.layers, model.norm, model.rotary_emb, lm_head); use dp_shard/tp instead for this model"
        )
    cfg = model.config
    if getattr(cfg, "tie_word_embeddings", False) and pp > 1:
        raise PrepareError(
            "tie_word_embeddings=True across pipeline stages is not supported (the tied weight "
            "would live on the first and last stage); use a config with tie_word_embeddings=False"
        )
    impl = getattr(cfg, "_attn_implementation", "eager")
    if impl not in ("eager", "sdpa"):
        raise PrepareError(
            f"pipeline stages pass an explicit causal mask, which attn_implementation={impl!r} "
            "does not take; load the model with attn_implementation='sdpa' or 'eager'"
        )
    return split_points([str(i) for i in range(len(parts[1]))], pp, boundaries)


def _hf_stage_forward(self, x: torch.Tensor) -> torch.Tensor:
    """One pipeline stage of a Llama-family transformers model: ids or hidden states in,
    hidden states or logits out."""
    base = getattr(self, self.base_model_prefix)
    h = base.embed_tokens(x) if base.embed_tokens is not None else x
    b, s = h.shape[0], h.shape[1]
    pos = torch.arange(s, device=h.device).unsqueeze(0).expand(b, -1)
    pe = base.rotary_emb(h, pos)
    mask = torch.full((s, s), float("-inf"), device=h.device, dtype=h.dtype).triu(1)[None, None]
    for layer in base.layers.values():
        out = layer(h, attention_mask=mask, position_ids=pos, position_embeddings=pe)
        h = out[0] if isinstance(out, tuple) else out
    if base.norm is None:
        return h
    return self.lm_head(base.norm(h))


def keep_stage(model: nn.Module, stage: int, owned: list[str], last: bool) -> nn.Module:
    """Turn ``model`` into pipeline stage ``stage`` in place, keeping blocks ``owned``."""
    if hasattr(model, "keep_stage") and hasattr(model, "layers"):
        for key in list(model.layers.keys()):
            if key not in owned:
                del model.layers[key]
        if stage != 0:
            model.tok_embeddings = None
        if not last:
            model.norm = None
            model.output = None
        return model
    base, layers = _hf_parts(model)
    base.layers = nn.ModuleDict({k: layers[int(k)] for k in owned})  # names stay model.layers.<i>
    if stage != 0:
        base.embed_tokens = None
    if not last:
        base.norm = None
        model.lm_head = None
    model.forward = types.MethodType(_hf_stage_forward, model)
    return model


def stage_blocks(model: nn.Module) -> tuple[list[str], list[nn.Module]]:
    """Names and modules of the blocks a stage kept (for FSDP2, AC and compile)."""
    if hasattr(model, "keep_stage") and hasattr(model, "layers"):
        return [f"layers.{k}" for k in model.layers.keys()], list(model.layers.values())
    prefix = model.base_model_prefix
    layers = getattr(model, prefix).layers
    return [f"{prefix}.layers.{k}" for k in layers.keys()], list(layers.values())


def make_schedule(model, stage_idx: int, n_stages: int, device, group, spec, loss_fn):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    stage = PipelineStage(model, stage_idx, n_stages, device, group=group)
    cls = ScheduleGPipe if spec.pp_schedule == "gpipe" else Schedule1F1B
    return cls(stage, n_microbatches=spec.microbatches, loss_fn=loss_fn)


class PipelinePrepared(Prepared):
    """Train steps through a pipeline schedule; the loss comes from the last stage, then is
    averaged over the data-parallel groups (``pp x dp_shard``).

    ``last_run``: the latest step as it ran on this stage, for the schedule picture:
    ``{"stage", "n_stages", "schedule", "microbatches", "wall_start", "duration", "torch_order",
    "blocks": [["F" | "B", microbatch, start s, end s]]}`` (times from the step's start;
    each block is one ``forward_one_chunk`` / ``backward_one_chunk`` call of the stage)."""

    own_train_step = True  # the schedule runs forward and backward

    def __init__(
        self, *, schedule, stage_idx: int, n_stages: int, pp_group, last_rank: int, sharded: bool = False, **kw
    ):
        super().__init__(**kw)
        self.schedule = schedule
        self.stage_idx, self.n_stages = stage_idx, n_stages
        self.pp_group = pp_group
        self.last_rank = last_rank
        self._sharded = sharded
        self.reduce_scatter = sharded  # stages FSDP2-sharded over dp_shard
        self.last_run: dict | None = None
        self._blocks: list | None = None
        stage = schedule._stage
        for kind, name in (("F", "forward_one_chunk"), ("B", "backward_one_chunk")):
            setattr(stage, name, self._timed(kind, getattr(stage, name)))

    def _timed(self, kind: str, fn):
        def timed(chunk_id, *args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(chunk_id, *args, **kwargs)
            finally:
                if self._blocks is not None:
                    self._blocks.append([kind, int(chunk_id), t0, time.perf_counter()])

        return timed

    @property
    def is_first(self) -> bool:
        return self.stage_idx == 0

    @property
    def is_last(self) -> bool:
        return self.stage_idx == self.n_stages - 1

    def reshard(self) -> None:
        if self._sharded:
            from torch.distributed.fsdp import FSDPModule

            for m in self.model.modules():
                if isinstance(m, FSDPModule):
                    m.reshard()

    def train_step(self, batch) -> float:
        self.check()
        x, y = (t.to(self.device) for t in batch)
        mb = self.spec.microbatches
        if x.shape[0] % mb:
            raise PrepareError(
                f"batch of {x.shape[0]} does not split into pp_microbatches={mb}; use a batch size that is a multiple of {mb}"
            )
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        self._blocks, t0, wall = [], time.perf_counter(), time.time()
        # return_outputs=False: the last stage would otherwise keep every micro-batch's
        # output (the logits) until the step ends, to return them merged; the loss is all
        # the step needs
        with self._autocast_ctx():
            if self.is_first and self.is_last:
                self.schedule.step(x, target=y, losses=losses, return_outputs=False)
            elif self.is_first:
                self.schedule.step(x, return_outputs=False)
            elif self.is_last:
                self.schedule.step(target=y, losses=losses, return_outputs=False)
            else:
                self.schedule.step(return_outputs=False)
        blocks, self._blocks = self._blocks, None
        self.last_run = {
            "stage": self.stage_idx,
            "n_stages": self.n_stages,
            "schedule": self.spec.pp_schedule,
            "microbatches": mb,
            "wall_start": wall,
            "duration": time.perf_counter() - t0,
            "torch_order": schedule_order(self.schedule, self.stage_idx),
            "blocks": [[k, i, a - t0, b - t0] for k, i, a, b in blocks],
        }
        self.optimizer.step()
        self.steps += 1
        loss = torch.stack([l.detach().float() for l in losses]).mean() if losses else torch.zeros(())
        if self.n_stages > 1:
            dist.broadcast(loss, src=self.last_rank, group=self.pp_group)
        return float(all_reduce_mean(loss, self.loss_group))
