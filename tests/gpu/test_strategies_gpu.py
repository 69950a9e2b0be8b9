"""The CUDA path on one GPU (``-m gpu``; skipped without CUDA, so never run on the CPU machines).

One spawned process initialises NCCL at world size 1 on GPU 0 (no rank set needed) and runs
each strategy through ``prepare`` with the mesh device left to follow the process group. The
losses are compared with a plain single-device loop written here (fp32: 1e-5 relative, TF32
off in both; bf16: 2e-2 relative to that fp32 loop, since bf16 keeps an 8-bit mantissa and
AdamW amplifies early rounding differences, the bound the CPU bf16 test uses). The wrapper
type, Accelerate's ``distributed_type`` and the parameter/gradient dtypes are asserted, not
the layout's label. Not yet run on a GPU: these tests were written on a machine without one.
"""

import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

STEPS, BATCH, LR, SEED = 8, 8, 1e-2, 1
FP32_REL, BF16_REL = 1e-5, 2e-2


def _with_nccl(fn, *args):
    import socket

    import torch.distributed as dist

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(
        MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", LOCAL_WORLD_SIZE="1"
    )
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        return fn(*args)
    finally:
        dist.destroy_process_group()


def _reference():
    """The plain loop: same model, seed, data and optimizer, no workbench code in the step."""
    from workbench.models import GPT, GPTConfig, TextDataset, batches
    from workbench.strategies import lm_loss

    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny()).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=LR)
    out = []
    for x, y in batches(TextDataset(32), BATCH, 0, 1, seed=SEED, steps=STEPS):
        loss = lm_loss(model(x.cuda()), y.cuda())
        opt.zero_grad()
        loss.backward()
        opt.step()
        out.append(loss.item())
    return out


def _describe(p) -> dict:
    from accelerate.state import AcceleratorState

    model = p.model
    kinds = []
    from torch.nn.parallel import DistributedDataParallel

    if isinstance(model, DistributedDataParallel):
        kinds.append("DDP")
    try:
        from torch.distributed.fsdp import FSDPModule

        if isinstance(model, FSDPModule):
            kinds.append("FSDP2")
    except ImportError:  # pragma: no cover
        pass
    try:
        import deepspeed

        if isinstance(model, deepspeed.DeepSpeedEngine):
            kinds.append("DeepSpeedEngine")
    except ImportError:  # pragma: no cover
        pass
    params = list(p.unwrap().parameters())
    state = AcceleratorState._shared_state
    return {
        "wrapper": kinds,
        "param_dtypes": sorted({str(q.dtype) for q in params}),
        "grad_dtypes": sorted({str(q.grad.dtype) for q in params if q.grad is not None}),
        "param_devices": sorted({q.device.type for q in params}),
        "distributed_type": str(state["distributed_type"]) if state.get("distributed_type") is not None else None,
        "path": p.layout["path"],
    }


def _train(spec_text: str) -> dict:
    from workbench.models import GPT, GPTConfig, TextDataset, batches
    from workbench.strategies import prepare, reset_accelerate_state

    torch.manual_seed(0)
    p = prepare(GPT(GPTConfig.tiny()), lambda ps: torch.optim.AdamW(ps, lr=LR), spec_text)
    try:
        losses = [
            p.train_step(b) for b in batches(TextDataset(32), BATCH, p.dp_rank, p.dp_size, seed=SEED, steps=STEPS)
        ]
        return {
            "losses": losses,
            **_describe(p),
            "accelerate_env": sorted(k for k in os.environ if k.startswith("ACCELERATE_USE_")),
        }
    finally:
        p.close()
        reset_accelerate_state()


def _all(specs):
    return {"reference": _reference(), **{s: _train(s) for s in specs}}


def _spawned(fn, *args, timeout: float = 180.0):
    """``fn(*args)`` in a spawned world-size-1 NCCL process; a hang there fails this test alone
    (the pool's exit ends the worker) instead of holding the GPU check to its end."""
    import multiprocessing as mp

    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply_async(_with_nccl, (fn, *args)).get(timeout)


SPECS = {  # spec -> (wrapper, AcceleratorState distributed_type, parameter dtype, grad dtype, tolerance)
    "ddp": ("DDP", "DistributedType.MULTI_GPU", "torch.float32", "torch.float32", FP32_REL),
    "fsdp2": ("FSDP2", "DistributedType.FSDP", "torch.float32", "torch.float32", FP32_REL),
    "fsdp2 dtype=bf16": ("FSDP2", "DistributedType.FSDP", "torch.float32", "torch.float32", BF16_REL),
    "fsdp2 via=native": ("FSDP2", None, "torch.float32", "torch.float32", FP32_REL),
    "fsdp2 via=native dtype=bf16": ("FSDP2", None, "torch.float32", "torch.float32", BF16_REL),
    "zero stage=2 dtype=bf16": ("DeepSpeedEngine", "DistributedType.DEEPSPEED", "torch.bfloat16", None, BF16_REL),
    "zero stage=2 dtype=bf16 via=native": ("DeepSpeedEngine", None, "torch.bfloat16", None, BF16_REL),
}


@pytest.fixture(scope="module")
def runs():
    return _spawned(_all, list(SPECS))


@pytest.mark.parametrize("spec", list(SPECS))
def test_losses_wrapper_and_dtypes_on_one_gpu(runs, spec):
    wrapper, dist_type, pdtype, gdtype, rel = SPECS[spec]
    r, ref = runs[spec], runs["reference"]
    assert ref[-1] < ref[0] - 1.0  # the reference actually trains
    worst = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref))
    assert worst <= rel, f"{spec}: worst relative loss error {worst:.2e} > {rel:.0e}\n{r['losses']}\n{ref}"
    assert r["wrapper"] == [wrapper]
    assert r["param_devices"] == ["cuda"]  # the mesh device followed NCCL
    assert r["param_dtypes"] == [pdtype]
    if gdtype is not None:  # DeepSpeed frees the module's .grad into its own buckets
        assert r["grad_dtypes"] == [gdtype]
    if dist_type is not None:
        assert r["path"] == "accelerate" and r["distributed_type"] == dist_type


def _switch():
    return [_train(s) for s in ("fsdp2", "ddp", "zero stage=2 dtype=bf16")]


def test_fsdp2_ddp_zero_switch_in_one_process():
    """Accelerate's environment from fsdp2 must not make the next ddp an FSDP model."""
    a, b, c = _spawned(_switch)
    assert a["wrapper"] == ["FSDP2"] and a["distributed_type"] == "DistributedType.FSDP"
    assert b["wrapper"] == ["DDP"] and b["distributed_type"] == "DistributedType.MULTI_GPU"
    assert c["wrapper"] == ["DeepSpeedEngine"] and c["distributed_type"] == "DistributedType.DEEPSPEED"
    assert "ACCELERATE_USE_FSDP" not in b["accelerate_env"]
