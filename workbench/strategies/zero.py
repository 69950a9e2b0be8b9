"""DeepSpeed ZeRO (Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training
Trillion Parameter Models"): stage 1 partitions optimizer state, stage 2 also gradients,
stage 3 also parameters. Stage 0 is plain data parallel through the DeepSpeed engine.
DeepSpeed wraps the workbench's existing process group rather than creating one."""

from __future__ import annotations

import logging
import os

import torch

from .base import Context, Prepared, PrepareError, factory_from_optimizer, over_every_rank, register
from .blocks import apply_activation_checkpointing, find_blocks
from .layout import flat_layout
from .meshes import enter_layout

__all__ = [
    "ZeroStrategy",
    "DeepSpeedPrepared",
    "check_nvme",
    "deepspeed_config",
    "import_deepspeed",
    "infinity_config",
    "ninja_beside_python",
    "remove_swap_files",
    "swap_folders",
]


def import_deepspeed(device_type: str):
    """Import DeepSpeed with the accelerator matching ``device_type``.

    DeepSpeed picks its accelerator once per process (``DS_ACCELERATOR`` if set, else a probe
    for CUDA and friends, falling back to its CPU accelerator on gloo), so it is set to the
    mesh device before the rank's first DeepSpeed import. The default process group already
    exists, so ``deepspeed.comm.init_distributed`` wraps it; the engine reads ``LOCAL_RANK``."""
    want = "cuda" if device_type == "cuda" else "cpu"
    os.environ.setdefault("DS_ACCELERATOR", want)
    ninja_beside_python()
    try:
        import deepspeed
        from deepspeed.accelerator import get_accelerator
    except ImportError as e:  # pragma: no cover - deepspeed is an optional extra
        raise PrepareError("kind='zero' needs DeepSpeed: pip install 'distrain-workbench[deepspeed]'") from e
    got = get_accelerator().device_name()
    if not got.startswith(want):
        raise PrepareError(
            f"DeepSpeed's accelerator on this rank is {got!r} but the mesh device is {device_type!r}; "
            f"it is chosen once per process: restart the ranks with DS_ACCELERATOR={want}"
        )
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if want == "cpu":
        # TorchBackend JIT-compiles a shared-memory all-reduce kernel (slow, needs a C++
        # compiler) on first use; it only serves inference all-reduce. Training uses gloo.
        import sys

        import deepspeed.comm.torch  # noqa: F401

        sys.modules["deepspeed.comm.torch"].build_shm_op = lambda: None
    return deepspeed


def ninja_beside_python() -> None:
    """Put the environment's own ``bin`` first on PATH where ninja is installed there.

    DeepSpeed builds its ops on first use (torch's JIT) with the ninja on PATH; pip installs one
    beside DeepSpeed, but a kernel started without its environment activated finds another one
    or none ("Ninja is required"). Two ninja versions read each other's build log as changed
    commands, so every switch between them rebuilt the ops: minutes each time."""
    import sys

    here = os.path.dirname(sys.executable)
    path = os.environ.get("PATH", "")
    if os.access(os.path.join(here, "ninja"), os.X_OK) and path.split(os.pathsep)[0] != here:
        os.environ["PATH"] = os.pathsep.join([here, *[p for p in path.split(os.pathsep) if p and p != here]])


def check_nvme(spec) -> None:
    """Before the engine: the swap folder is writable and DeepSpeed's async I/O op can be built
    (it compiles against libaio on first use, then loads from TORCH_EXTENSIONS_DIR)."""
    path = spec.nvme_path
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise PrepareError(
            f"nvme_path={path!r}: cannot create the folder ({e.strerror}); give a folder this rank can write"
        ) from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise PrepareError(f"nvme_path={path!r}: this rank cannot write there; give a folder it can write")
    from deepspeed.accelerator import get_accelerator

    builder = get_accelerator().create_op_builder("AsyncIOBuilder")
    if builder is None or not builder.is_compatible(verbose=False):
        raise PrepareError(
            "offload to nvme needs DeepSpeed's async I/O op, built against libaio on first use: install "
            "libaio-dev (apt-get install libaio-dev) and a C++ compiler, or drop offload_param/offload_optimizer=nvme"
        )
    load_op(builder, "DeepSpeed's async I/O op (for offload to nvme)")


def load_op(builder, what: str) -> None:
    """Build (first use) or load a DeepSpeed op now, so that a wait on another process's build
    says what it waits for, and a lock left by a build ended part-way is refused, named."""
    import sys

    from .extension_lock import StaleLock, named_waits

    rank = os.environ.get("RANK", "?")

    def say(text: str) -> None:
        print(f"rank {rank}: {text}", file=sys.stderr, flush=True)

    ninja_beside_python()
    try:
        with named_waits(what, say):
            builder.load(verbose=False)
    except StaleLock as exc:
        raise PrepareError(str(exc)) from None


def swap_folders(spec, rank: int) -> list[str]:
    """This rank's folders under ``nvme_path`` that DeepSpeed's swappers write
    (``zero_stage_3/optimizer/rank{r}``, ``zero_stage_3/<dtype>params/rank{r}``)."""
    base = os.path.join(spec.nvme_path, "zero_stage_3")
    if not os.path.isdir(base):
        return []
    return [
        os.path.join(base, d, f"rank{rank}")
        for d in sorted(os.listdir(base))
        if os.path.isdir(os.path.join(base, d, f"rank{rank}"))
    ]


def remove_swap_files(spec, rank: int) -> None:
    """Remove what DeepSpeed swapped to ``nvme_path`` for this rank (it leaves its files behind),
    and the emptied ``zero_stage_3`` folders; the user's folder stays."""
    import shutil

    for folder in swap_folders(spec, rank):
        shutil.rmtree(folder, ignore_errors=True)
    base = os.path.join(spec.nvme_path, "zero_stage_3")
    for folder in [os.path.join(base, d) for d in (os.listdir(base) if os.path.isdir(base) else [])] + [base]:
        try:
            os.rmdir(folder)  # only once empty: another rank may still be removing its own
        except OSError:
            pass


# DeepSpeed's async I/O (libaio) for NVMe swaps: 1 MiB blocks, 8 requests in flight per
# thread, events overlapped with compute (its documented defaults for ZeRO-Infinity)
AIO = {"block_size": 1048576, "queue_depth": 8, "thread_count": 1, "single_submit": False, "overlap_events": True}


def infinity_config(spec) -> dict:
    """ZeRO-Infinity offload (Rajbhandari et al. 2021) and ZeRO++ (Wang et al. 2023) entries
    of ``zero_optimization``: what the spec's options name, nothing where they are off."""
    zero: dict = {}
    if spec.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": spec.offload_optimizer, "pin_memory": True}
        if spec.offload_optimizer == "nvme":
            zero["offload_optimizer"].update(nvme_path=spec.nvme_path, buffer_count=4)
    if spec.offload_param != "none":
        zero["offload_param"] = {"device": spec.offload_param, "pin_memory": True}
        if spec.offload_param == "nvme":
            zero["offload_param"].update(
                nvme_path=spec.nvme_path,
                buffer_count=spec.nvme_buffer_count,
                buffer_size=spec.nvme_buffer_size,
                max_in_cpu=spec.nvme_max_in_cpu,
            )
    if spec.quantized_weights:
        zero["zero_quantized_weights"] = True  # qwZ: block-quantized int8 weights all-gathered
    if spec.quantized_gradients:
        zero["zero_quantized_gradients"] = True  # qgZ: int4 all-to-all gradient reduce-scatter
    if spec.hpz > 1:
        zero["zero_hpz_partition_size"] = spec.hpz  # hpZ: secondary weight shards within hpz ranks
    return zero


def partition_fp32_for_nvme(ds, model, config: dict) -> None:
    """Partition an fp32 model for NVMe parameter offload before ``deepspeed.initialize`` does.

    DeepSpeed's own call hands ``zero.Init`` the model's dtype, and Init's
    ``dtype or fp16 if accelerator.is_fp16_supported() else bf16`` reads bf16 wherever the
    accelerator lacks fp16 (CPUs without AVX512-FP16/AMX-FP16): fp32 shards then get bf16 swap
    buffers, a dtype error in the first step, or shards under 2 MiB silently kept in memory.
    Given the config and no dtype, Init reads fp32 from it; initialize then finds ZeRO parameters.
    """
    if config.get("bf16", {}).get("enabled") or config.get("fp16", {}).get("enabled"):
        return  # the engine casts first and Init gets the half dtype it should
    if any(p.dtype != torch.float32 for p in model.parameters()):
        return
    ds.zero.Init(module=model, config_dict_or_path=config, remote_device="nvme", pin_memory=True)


def deepspeed_config(spec, *, world_size: int, n_params: int | None = None) -> dict:
    zero: dict = {"stage": spec.zero_stage}
    if n_params:
        # DeepSpeed allocates its reduce / all-gather buckets whole (5e8 elements = 2 GB
        # in fp32 by default) whatever the model's size: size them to the model instead.
        bucket = int(min(5e8, max(n_params, 2**16)))
        zero["reduce_bucket_size"] = bucket
        zero["allgather_bucket_size"] = bucket
        if spec.zero_stage == 3:
            zero["stage3_prefetch_bucket_size"] = bucket
    if spec.cpu_offload:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": True}
        if spec.zero_stage == 3:
            zero["offload_param"] = {"device": "cpu", "pin_memory": True}
    zero.update(infinity_config(spec))
    if spec.offload_param == "nvme":
        # DeepSpeed's NVMe prefetch swaps in a parameter whose read is already in flight and stops
        # at its own assertion ("param N already assigned swap buffer id K") once parameters are
        # read from disk during training (past nvme_max_in_cpu); each is then read when it is used
        zero["stage3_prefetch_bucket_size"] = 0
    cfg = {
        "train_micro_batch_size_per_gpu": 1,  # bookkeeping only: batches come from the caller
        "gradient_accumulation_steps": 1,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "gradient_clipping": 0.0,  # DeepSpeed 0.19 defaults to clipping at 1.0; torch does not clip  # torch optimizers (AdamW) on partitions
        "steps_per_print": 2**31 - 1,
        "wall_clock_breakdown": False,
    }
    if "offload_optimizer" in zero or "offload_param" in zero:
        # the caller's torch optimizer steps the offloaded partitions (DeepSpeed otherwise
        # insists on its own CPU Adam, a C++ op built on first use)
        cfg["zero_force_ds_cpu_optimizer"] = False
    if "nvme" in (spec.offload_param, spec.offload_optimizer):
        cfg["aio"] = dict(AIO)
    if spec.param_dtype == "bf16":
        cfg["bf16"] = {"enabled": True}
    elif spec.param_dtype == "fp16":
        cfg["fp16"] = {"enabled": True}
    return cfg


def forget_deepspeed_groups(groups) -> None:
    """After DeepSpeed's groups were destroyed: drop its module-level references to them, so
    the next ``initialize`` makes new ones and the old ones' threads end."""
    import deepspeed.utils.groups as ds_groups

    for name, value in list(vars(ds_groups).items()):
        if not name.startswith("_") or name.startswith("__"):
            continue
        if any(value is g for g in groups):
            setattr(ds_groups, name, None)
        elif isinstance(value, dict):
            for k in [k for k, v in value.items() if any(v is g for g in groups)]:
                del value[k]


class DeepSpeedPrepared(Prepared):
    own_train_step = True  # engine.backward / engine.step
    engine_state = True  # ZeRO's flat partitions are read and written through the engine

    def check(self) -> None:
        pass  # the engine owns its optimizer and parameters

    def train_step(self, batch) -> float:
        engine = self.model
        x, y = (t.to(self.device) for t in batch)
        engine.train()
        engine.zero_grad()
        out = engine(x)
        loss = self.compute_loss(out, y)
        engine.backward(loss)
        engine.step()
        self.steps += 1
        from .base import all_reduce_mean

        return float(all_reduce_mean(loss.detach(), self.loss_group))

    def unwrap(self):
        return self.model.module

    nvme_spec = None  # the spec whose nvme_path this rank swapped to (ZeRO-Infinity), cleaned at close
    swap_rank = 0

    def close(self) -> None:
        try:
            self.model.destroy()
        except Exception:  # older engines have no destroy()
            pass
        if self.nvme_spec is not None:
            remove_swap_files(self.nvme_spec, self.swap_rank)
        super().close()


@register
class ZeroStrategy:
    kind = "zero"

    def apply(self, model, optimizer, ctx: Context) -> Prepared:
        s = ctx.spec
        if ctx.device.type == "cuda":
            os.environ.setdefault("LOCAL_RANK", str(ctx.device.index or 0))
        else:
            os.environ.setdefault("LOCAL_RANK", "0")
        ds = import_deepspeed(ctx.device.type)
        if s.activation_checkpointing != "none":
            blocks = find_blocks(model, ctx.hints.blocks, purpose="activation checkpointing")
            apply_activation_checkpointing(blocks, s.activation_checkpointing, ctx.notes)
        if isinstance(optimizer, torch.optim.Optimizer):
            optimizer = factory_from_optimizer(optimizer)
        nvme = "nvme" in (s.offload_param, s.offload_optimizer)
        if nvme:
            check_nvme(s)
        # DeepSpeed's first initialize makes groups (a copy of the world) it reuses after
        enter_layout(("deepspeed", ctx.mesh_device), on_free=forget_deepspeed_groups)
        config = deepspeed_config(s, world_size=ctx.world_size, n_params=sum(p.numel() for p in model.parameters()))
        try:
            if s.zero_stage == 3 and s.offload_param == "nvme":
                partition_fp32_for_nvme(ds, model, config)
            engine, opt, _, _ = ds.initialize(model=model, optimizer=optimizer, config=config, dist_init_required=False)
        except BaseException:
            if nvme:
                remove_swap_files(s, ctx.rank)
            raise
        ctx.notes.append(
            f"DeepSpeed ZeRO stage {s.zero_stage} over {ctx.world_size} rank(s) "
            f"({['plain DP', 'optimizer state', 'optimizer state + gradients', 'optimizer state + gradients + parameters'][s.zero_stage]} partitioned)"
        )
        if s.cpu_offload:
            ctx.notes.append("optimizer state offloaded to CPU")
        extras = infinity_config(s)
        if extras:
            ctx.notes.append(f"ZeRO-Infinity / ZeRO++: {extras}")
        if nvme:
            ctx.notes.append(
                f"ZeRO-Infinity: swap files under {os.path.join(s.nvme_path, 'zero_stage_3')} "
                "(DeepSpeed's async I/O; tensors under 1 MiB stay in memory, and between steps it keeps up "
                "to 1e9 parameter elements in memory, its max_in_cpu), removed at close"
            )
        prepared = DeepSpeedPrepared(
            model=engine,
            optimizer=opt,
            layout=flat_layout(ctx, strategy=self.kind, path="deepspeed", module=engine.module),
            inner=engine.module,
            **over_every_rank(ctx),
        )
        if nvme:
            prepared.nvme_spec, prepared.swap_rank = s, ctx.rank
        return prepared
