"""The layouts of the strategy benchmark written by hand, as a user would in a ``torchrun``
script without the workbench: ``DDP(...)``, ``fully_shard`` per block, DeepSpeed's
``initialize``, DTensor's ``parallelize_module`` with the plan written out, 2D meshes and
``torch.distributed.pipelining``. Only the model class comes from the workbench.

``build(kind, model, lr)`` returns ``step(batch) -> float`` (the mean loss over ranks).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
import torch.nn.functional as F


def lm_loss(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


def _mean(loss: torch.Tensor) -> float:
    loss = loss.detach().clone()
    dist.all_reduce(loss)
    return float(loss) / dist.get_world_size()


def _plain_step(model, opt):
    def step(batch) -> float:
        x, y = batch
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        opt.step()
        return _mean(loss)

    return step


def ddp(model, lr):
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(model)
    return _plain_step(model, torch.optim.AdamW(model.parameters(), lr=lr))


def fsdp2(model, lr):
    from torch.distributed.fsdp import fully_shard

    for block in model.layers.values():
        fully_shard(block)
    fully_shard(model)
    return _plain_step(model, torch.optim.AdamW(model.parameters(), lr=lr))


def zero(model, lr, stage: int = 2):
    import sys

    import deepspeed
    import deepspeed.comm.torch  # noqa: F401

    # on CPU DeepSpeed JIT-compiles an inference-only shared-memory all-reduce (slow) on first
    # use; training all-reduces through gloo, so skip the build as the workbench does
    sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None

    n = sum(p.numel() for p in model.parameters())
    # buckets sized to the model (DeepSpeed's default allocates 2 GB whole), a torch AdamW
    # (DeepSpeed's own CPU Adam would compile an extension first), no clipping
    config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 0.0,
        "zero_optimization": {"stage": stage, "reduce_bucket_size": n, "allgather_bucket_size": n},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 2**31 - 1,
    }
    engine, _, _, _ = deepspeed.initialize(
        model=model, optimizer=torch.optim.AdamW(model.parameters(), lr=lr), config=config, dist_init_required=False
    )

    def step(batch) -> float:
        x, y = batch
        loss = lm_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        return _mean(loss)

    return step


def tp_plan(model, sequence_parallel: bool = True) -> dict:
    """Megatron's plan written out: column-parallel q/k/v, w1/w3; row-parallel wo, w2."""
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        PrepareModuleInput,
        RowwiseParallel,
        SequenceParallel,
    )

    act = Shard(1) if sequence_parallel else Replicate()
    plan = {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=act),
        "output": ColwiseParallel(input_layouts=act, output_layouts=Replicate()),
    }
    if sequence_parallel:
        plan["norm"] = SequenceParallel()
    for key in model.layers.keys():
        p = f"layers.{key}."
        if sequence_parallel:
            plan[p + "attention_norm"] = SequenceParallel()
            plan[p + "ffn_norm"] = SequenceParallel()
            plan[p + "attention"] = PrepareModuleInput(
                input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)
            )
            plan[p + "feed_forward"] = PrepareModuleInput(
                input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)
            )
        for name in ("attention.wq", "attention.wk", "attention.wv", "feed_forward.w1", "feed_forward.w3"):
            plan[p + name] = ColwiseParallel()
        plan[p + "attention.wo"] = RowwiseParallel(output_layouts=act)
        plan[p + "feed_forward.w2"] = RowwiseParallel(output_layouts=act)
    return plan


def tp(model, lr):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),), mesh_dim_names=("tp",))
    parallelize_module(model, mesh, tp_plan(model))
    return _plain_step(model, torch.optim.AdamW(model.parameters(), lr=lr))


def fsdp2_tp(model, lr, tp_size: int = 2):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size() // tp_size, tp_size), mesh_dim_names=("dp", "tp"))
    parallelize_module(model, mesh["tp"], tp_plan(model))
    for block in model.layers.values():
        fully_shard(block, mesh=mesh["dp"])
    fully_shard(model, mesh=mesh["dp"])
    return _plain_step(model, torch.optim.AdamW(model.parameters(), lr=lr))


def pp(model, lr, microbatches: int = 4):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    n, stage_idx = dist.get_world_size(), dist.get_rank()
    model.keep_stage(stage_idx, n)
    stage = PipelineStage(model, stage_idx, n, torch.device("cpu"))
    schedule = Schedule1F1B(stage, n_microbatches=microbatches, loss_fn=lm_loss)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    first, last = stage_idx == 0, stage_idx == n - 1

    def step(batch) -> float:
        x, y = batch
        opt.zero_grad(set_to_none=True)
        losses: list = []
        if first:
            schedule.step(x)
        elif last:
            schedule.step(target=y, losses=losses)
        else:
            schedule.step()
        opt.step()
        loss = torch.stack(losses).mean().detach() if losses else torch.zeros(())
        dist.broadcast(loss, src=n - 1)
        return float(loss)

    return step


BUILDERS = {"ddp": ddp, "fsdp2": fsdp2, "zero": zero, "tp": tp, "fsdp2_tp": fsdp2_tp, "pp": pp}


def build(kind: str, model, lr: float):
    return BUILDERS[kind](model, lr)


def data_rank(kind: str) -> tuple[int, int]:
    """(dp_rank, dp_size) of this rank under ``kind``: which slice of the batch it reads."""
    n, r = dist.get_world_size(), dist.get_rank()
    if kind in ("tp", "pp"):
        return 0, 1
    if kind == "fsdp2_tp":
        return r // 2, n // 2
    return r, n
