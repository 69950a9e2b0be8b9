"""The Accelerate path: on CUDA, DDP / FSDP2 / DeepSpeed ZeRO go through
``accelerate.Accelerator``; on CPU the same spec takes the native path, never a silent
downgrade: the layout's ``"path"`` and notes say which was taken and why. Accelerate finds
the process group the workbench runtime made; its process-wide singletons are reset on every
strategy switch (:func:`reset_accelerate_state`), so no plugin leaks into the next prepare."""

from __future__ import annotations

import torch

from .base import TORCH_DTYPES, Context, Prepared, PrepareError, all_reduce_mean, over_every_rank
from .layout import flat_layout

__all__ = [
    "reset_accelerate_state",
    "ACCELERATE_ENV",
    "ACCELERATE_KINDS",
    "choose_path",
    "accelerate_prepare",
    "AcceleratePrepared",
]

ACCELERATE_KINDS = ("ddp", "fsdp2", "zero")


# What Accelerate's plugins write into os.environ (accelerate/utils/fsdp_utils.py,
# dataclasses.py, accelerator.py); Accelerator() reads them back, so a plugin from the
# previous strategy would otherwise decide the next wrapper (fsdp2 -> ddp stays FSDP).
ACCELERATE_ENV = (
    "ACCELERATE_USE_FSDP",
    "ACCELERATE_USE_DEEPSPEED",
    "ACCELERATE_USE_MEGATRON_LM",
    "FSDP_CPU_RAM_EFFICIENT_LOADING",
    "DEEPSPEED_USE_HPU",
)


def reset_accelerate_state() -> None:
    """Forget every Accelerate singleton and the environment its plugins set (safe when none exists)."""
    import os
    import sys

    for key in ACCELERATE_ENV:
        os.environ.pop(key, None)
    # the singletons live in those modules: never imported here, there is nothing to forget
    # (importing accelerate and transformers only to reset them would cost a fresh rank seconds)
    if "accelerate.state" in sys.modules:
        from accelerate.state import AcceleratorState, GradientState

        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    hf_deepspeed = sys.modules.get("transformers.integrations.deepspeed")
    if hf_deepspeed is not None and hasattr(hf_deepspeed, "unset_hf_deepspeed_config"):
        hf_deepspeed.unset_hf_deepspeed_config()  # transformers' last DeepSpeed config (a module-level weakref)


def _zero_extras(spec) -> bool:
    """ZeRO-Infinity / ZeRO++ settings Accelerate's DeepSpeed plugin does not carry."""
    return (
        spec.offload_param != "none"
        or spec.offload_optimizer != "none"
        or spec.quantized_weights
        or spec.quantized_gradients
        or spec.hpz != 1
    )


def choose_path(spec, device_type: str) -> tuple[str, str]:
    """``(path, reason)``: ``"accelerate"`` on CUDA for the kinds Accelerate has a path for."""
    if spec.kind == "zero" and (device_type != "cuda" or spec.via == "native" or _zero_extras(spec)):
        return "deepspeed", "DeepSpeed engine used directly (deepspeed.initialize on the existing group)"
    if spec.via == "native":
        return "native", "via='native' requested"
    if spec.fp8 != "none" or spec.cuda_graphs:
        return "native", "fp8 / CUDA graphs are applied per block by the native path"
    if spec.ep > 1:
        return "native", "expert parallel: native fully_shard with the experts on a dp_shard_mod_ep x ep mesh"
    if spec.kind == "fsdp2" and spec.dp_replicate > 1:
        return "native", "HSDP (dp_replicate x dp_shard): native fully_shard on a 2-D mesh"
    if spec.kind not in ACCELERATE_KINDS:
        return "native", f"Accelerate has no path for kind={spec.kind!r} here: torch.distributed APIs used"
    if device_type != "cuda":
        return "native", "CPU ranks: Accelerate's path is used on CUDA only; the same strategy runs natively on gloo"
    return "accelerate", f"Accelerate {spec.kind} path on CUDA"


class AcceleratePrepared(Prepared):
    own_train_step = True  # accelerator.backward

    def __init__(self, *, accelerator, **kw):
        super().__init__(**kw)
        self.accelerator = accelerator

    def check(self) -> None:
        pass  # Accelerate swaps the optimizer's tensors itself (fsdp2_switch_optimizer_parameters)

    def train_step(self, batch) -> float:
        x, y = (t.to(self.device) for t in batch)
        self.model.train()
        self.optimizer.zero_grad(set_to_none=True)
        with self.accelerator.autocast():
            out = self.model(x)
        loss = self.compute_loss(out, y)
        self.accelerator.backward(loss)
        self.optimizer.step()
        self.steps += 1
        return float(all_reduce_mean(loss.detach(), self.loss_group))

    def unwrap(self):
        return self.accelerator.unwrap_model(self.model)

    def close(self) -> None:
        reset_accelerate_state()
        super().close()


def accelerate_prepare(model, optimizer, ctx: Context) -> Prepared:
    from accelerate import Accelerator

    s = ctx.spec
    reset_accelerate_state()
    mp = {"fp32": "no", "bf16": "bf16", "fp16": "fp16"}[s.param_dtype]
    kwargs: dict = {}
    if s.kind == "fsdp2":
        from accelerate.utils import FullyShardedDataParallelPlugin
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy

        from .blocks import find_blocks

        block_cls = {type(b).__name__ for b in find_blocks(model, ctx.hints.blocks).modules}
        kwargs["fsdp_plugin"] = FullyShardedDataParallelPlugin(
            fsdp_version=2,
            reshard_after_forward=s.reshard_after_forward,
            mixed_precision_policy=MixedPrecisionPolicy(
                param_dtype=TORCH_DTYPES[s.param_dtype] if s.param_dtype != "fp32" else None,
                reduce_dtype=TORCH_DTYPES[s.reduce],
            ),
            cpu_offload=CPUOffloadPolicy() if s.cpu_offload else False,
            auto_wrap_policy="transformer_based_wrap" if block_cls else None,
            transformer_cls_names_to_wrap=sorted(block_cls) or None,
            activation_checkpointing=s.activation_checkpointing != "none",
            state_dict_type="SHARDED_STATE_DICT",
        )
        mp = "no"  # the policy above carries the dtypes
    elif s.kind == "zero":
        from accelerate.utils import DeepSpeedPlugin

        kwargs["deepspeed_plugin"] = DeepSpeedPlugin(
            zero_stage=s.zero_stage,
            offload_optimizer_device="cpu" if s.cpu_offload else "none",
            offload_param_device="cpu" if s.cpu_offload and s.zero_stage == 3 else "none",
            gradient_accumulation_steps=1,
        )
        kwargs["deepspeed_plugin"].deepspeed_config["train_micro_batch_size_per_gpu"] = 1
    accelerator = Accelerator(mixed_precision=mp, **kwargs)
    if not callable(optimizer) or isinstance(optimizer, torch.optim.Optimizer):
        if not isinstance(optimizer, torch.optim.Optimizer):
            raise PrepareError("optimizer must be an optimizer or a factory params -> optimizer")
        opt = optimizer
    else:
        opt = optimizer([p for p in model.parameters() if p.requires_grad])
    pmodel, popt = accelerator.prepare(model, opt)
    inner = accelerator.unwrap_model(pmodel)
    ctx.notes.append(f"Accelerate {s.kind} ({accelerator.distributed_type}), mixed_precision={s.param_dtype}")
    return AcceleratePrepared(
        accelerator=accelerator,
        model=pmodel,
        optimizer=popt,
        layout=flat_layout(ctx, strategy=s.kind, path="accelerate", module=inner),
        inner=inner,
        **over_every_rank(ctx),
    )
