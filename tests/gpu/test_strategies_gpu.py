"""Tier 6: the Accelerate path on CUDA (NCCL, bf16). Skipped without a GPU.

Runs at world size 1 in a spawned process (NCCL process group on one device), so it
needs no rank set; multi-GPU runs use the same functions through ``ranks.apply``.
"""
import os

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _accelerate_on_gpu(spec_text: str, steps: int = 5):
    import socket

    import torch
    import torch.distributed as dist

    from workbench.models import GPT, GPTConfig, TextDataset, batches
    from workbench.strategies import prepare, reset_accelerate_state

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="0", WORLD_SIZE="1",
                      LOCAL_RANK="0", LOCAL_WORLD_SIZE="1")
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1, device_id=torch.device("cuda", 0))
    try:
        torch.manual_seed(0)
        cfg = GPTConfig.tiny()
        p = prepare(GPT(cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-2), spec_text, mesh_device="cuda")
        losses = [p.train_step(b) for b in batches(TextDataset(32), 8, p.dp_rank, p.dp_size, seed=1, steps=steps)]
        layout = p.layout
        p.close()
        reset_accelerate_state()
        return losses, layout
    finally:
        dist.destroy_process_group()


def _run(spec_text):
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    with ctx.Pool(1) as pool:
        return pool.apply(_accelerate_on_gpu, (spec_text,))


@pytest.mark.parametrize("spec", ["ddp", "fsdp2", "fsdp2 dtype=bf16", "zero stage=2 dtype=bf16"])
def test_accelerate_path_trains_on_gpu(spec):
    losses, layout = _run(spec)
    assert layout["path"] == "accelerate"
    assert losses[-1] < losses[0]


def test_native_path_on_gpu_when_asked():
    losses, layout = _run("fsdp2 via=native dtype=bf16")
    assert layout["path"] == "native" and losses[-1] < losses[0]
