"""Checkpoints written on a GPU (``-m gpu``; skipped without CUDA, so never run on the CPU
machines; written on a machine without a GPU).

A spawned world-size-1 NCCL rank (``one_gpu``) trains an FSDP2 GPT on GPU 0 for 3 steps and
saves it twice, synchronously and in the background (the async copy stages through pinned
host memory). Then:

- integrity on CUDA: both folders verify clean; a copy with one flipped byte in a shard is
  found damaged, its load is refused and the GPU model keeps its values;
- reshard: two CPU ranks on gloo (``gloo_harness``) lay the same model out with FSDP2 over 2
  ranks, load each checkpoint, and every model and optimizer tensor, gathered whole, equals
  the GPU rank's bit for bit (fp32 on both sides: a checkpoint is a copy, no tolerance).
"""

from __future__ import annotations

import os
import shutil

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]


def _whole(target) -> dict:
    """Every model and optimizer tensor of ``target``, gathered whole, on the CPU."""
    from workbench.engine.checkpoint.state import capture

    msd, osd = capture(target)
    out = {}
    for prefix, sd in (("model.", msd), ("optim.", osd)):
        for k, v in sd.items():
            if isinstance(v, torch.Tensor):
                v = v.full_tensor() if hasattr(v, "full_tensor") else v
                out[prefix + k] = v.detach().cpu().clone()
    return out


def _build(device_note: str):
    from workbench.engine.checkpoint.state import target_from_prepared
    from workbench.models import GPT, GPTConfig
    from workbench.strategies import prepare

    torch.manual_seed(0)
    p = prepare(GPT(GPTConfig.tiny()), lambda ps: torch.optim.AdamW(ps, lr=1e-2), "fsdp2")
    assert {q.device.type for q in p.unwrap().parameters()} == {device_note}
    return p, target_from_prepared(p)


def _save_on_gpu(root: str, device: str = "cuda") -> dict:
    from workbench.engine.checkpoint import load as ck_load
    from workbench.engine.checkpoint import save as ck_save
    from workbench.models import SyntheticDataset, batch_at
    from workbench.shared.checkpoint import catalog
    from workbench.shared.checkpoint.integrity import DamagedCheckpoint

    p, t = _build(device)
    ds = SyntheticDataset("copy", n=256, seq_len=16)
    for s in range(3):
        p.train_step(batch_at(ds, 8, s, dp_rank=p.dp_rank, dp_size=p.dp_size))
        t.state.step += 1
    ck_save.save(t, root, tag="sync")
    ck_save.save(t, root, tag="async", async_=True)
    ck_save.wait()
    out = {"pinned": [b.is_pinned() for b in ck_save._STAGE_CACHE.values()], "values": _whole(t)}
    folders = {tag: catalog.resolve(root, tag)[0] for tag in ("sync", "async")}
    out["problems"] = {tag: [str(x) for x in ck_load.verify(f)] for tag, f in folders.items()}
    # one flipped byte in a shard of a copy: found, refused, nothing applied
    damaged = os.path.join(os.path.dirname(root), "damaged")
    shutil.copytree(folders["sync"], damaged)
    shard = sorted(f for f in os.listdir(damaged) if f.endswith(".distcp"))[0]
    with open(os.path.join(damaged, shard), "r+b") as f:
        f.seek(os.path.getsize(f.name) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    out["damaged_problems"] = [str(x) for x in ck_load.verify(damaged)]
    try:
        ck_load.load(t, damaged)
        out["damaged_load"] = "loaded"
    except DamagedCheckpoint as exc:
        out["damaged_load"] = str(exc)
    after = _whole(t)
    out["unchanged"] = all(torch.equal(after[k], v) for k, v in out["values"].items())
    p.close()
    return out


def _load_on_cpu(rank, world, folder):
    from workbench.engine.checkpoint import load as ck_load

    p, t = _build("cpu")
    ck_load.load(t, folder)
    values = _whole(t)
    p.close()
    return values


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    from one_gpu import on_one_gpu

    root = str(tmp_path_factory.mktemp("gpu_ckpt") / "ckpts")
    return root, on_one_gpu(_save_on_gpu, root)


def test_checkpoint_integrity_on_cuda(saved):
    _, out = saved
    assert out["problems"] == {"sync": [], "async": []}
    assert out["pinned"] and all(out["pinned"])  # the async copy went through pinned host memory
    assert out["damaged_problems"], "a flipped byte in a shard was not found"
    assert any(".distcp" in x for x in out["damaged_problems"]), out["damaged_problems"]
    assert out["damaged_load"] != "loaded"
    assert out["unchanged"]  # the refused load left the GPU model as it was


@pytest.mark.parametrize("tag", ["sync", "async"])
def test_a_gpu_checkpoint_loads_onto_two_cpu_ranks_with_equal_values(saved, tag):
    from gloo_harness import run_ranks

    from workbench.shared.checkpoint import catalog

    root, out = saved
    folder = catalog.resolve(root, tag)[0]
    got = run_ranks(_load_on_cpu, 2, args=(folder,), timeout=150)
    want = out["values"]
    for r, values in enumerate(got):
        assert set(values) == set(want), f"rank {r}: keys differ"
        for k, v in want.items():
            assert values[k].dtype == v.dtype and torch.equal(values[k], v), f"rank {r}: {k} differs after reshard"
