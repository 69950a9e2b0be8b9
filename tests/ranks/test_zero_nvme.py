"""ZeRO-Infinity's NVMe offload on real CPU ranks: ZeRO-3 with parameters and optimizer state
swapped to a folder through DeepSpeed's async I/O op (libaio) trains like plain ZeRO-3.

Two fresh gloo processes (``gloo_harness``): DeepSpeed picks its accelerator once per process.
DeepSpeed swaps only tensors of 1 MiB or more (``MIN_AIO_BYTES``), so the model is sized for
it: the six feed-forward weights (256 x 2048 fp32: 1 MiB per rank's shard) and the flat
optimizer partition (fp32 master, Adam's m and v) go to disk, the smaller tensors stay in memory.
``nvme_max_in_cpu=0``: DeepSpeed keeps no parameter in memory between uses (by default it keeps
up to 1e9 elements, and a model this small would train from memory after its first read), so
the state is read back from disk in every step: counted (DeepSpeed's swap-ins), and shown to be
what the step uses (parameter files overwritten with NaNs make the next loss NaN). On a CPU
without fp16 support DeepSpeed's own partitioning gives fp32 shards bf16 swap buffers
(``zero.partition_fp32_for_nvme``): without that fix no parameter file is written here.
Losses over 20 steps against plain ZeRO-3 within 1e-6 relative per step: the same fp32
arithmetic on the same partitions, only where the state waits between steps differs (seen:
identical). The async I/O op is built on first use (about 4 minutes on 2 idle cores), into
TORCH_EXTENSIONS_DIR (.state/torch_extensions, see conftest.py), which `make test` does once
before the suite.
"""

from __future__ import annotations

import os

import pytest

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow  # one fresh process set importing DeepSpeed

from gloo_harness import run_ranks  # noqa: E402

STEPS = 20
REL = 1e-6
CFG = dict(dim=256, ffn_dim=2048)
# nvme_max_in_cpu=0: no parameter stays in host memory between uses (DeepSpeed's max_in_cpu would
# otherwise keep a model this small in memory after its first read), so every forward reads them;
# then every swapped shard in use at once needs a buffer: 8 of 300,000 elements (a shard is 262,144)
NVME = (
    "zero stage=3 offload_param=nvme offload_optimizer=nvme nvme_path={} "
    "nvme_buffer_count=8 nvme_buffer_size=300000 nvme_max_in_cpu=0"
)


def _count_reads() -> dict:
    """Count DeepSpeed's swap-ins on this rank: parameter shards read from the swap folder, and the
    optimizer partitions' state (fp32 master, Adam's m and v) read back for each step."""
    from deepspeed.runtime.swap_tensor.partitioned_optimizer_swapper import PartitionedOptimizerSwapper
    from deepspeed.runtime.swap_tensor.partitioned_param_swapper import AsyncPartitionedParameterSwapper
    from deepspeed.runtime.swap_tensor.pipelined_optimizer_swapper import PipelinedOptimizerSwapper

    reads = {"params": 0, "optimizer": 0}

    def counting(cls, name, key, per_call):
        real = getattr(cls, name)

        def wrapper(self, *args, **kwargs):
            reads[key] += per_call(*args)
            return real(self, *args, **kwargs)

        setattr(cls, name, wrapper)

    counting(AsyncPartitionedParameterSwapper, "swap_in", "params", lambda params, *a: len(params))
    counting(AsyncPartitionedParameterSwapper, "swap_into_buffer", "params", lambda *a: 1)
    for cls in (PartitionedOptimizerSwapper, PipelinedOptimizerSwapper):
        counting(cls, "swap_in_optimizer_state", "optimizer", lambda *a: 1)
    return reads


def _poison(paths) -> None:
    """Overwrite each swap file with NaNs, in place (same size)."""
    import numpy as np

    for path in paths:
        size = os.path.getsize(path)
        with open(path, "r+b") as f:
            f.write(np.full(size // 4, np.nan, dtype=np.float32).tobytes())


def nvme_against_plain(rank, world, folder, blocked):
    import math

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as dist

    from workbench.models import GPT, GPTConfig, TextDataset, batches
    from workbench.strategies import PrepareError, prepare

    def files():
        return sorted(os.path.relpath(os.path.join(d, f), folder) for d, _, fs in os.walk(folder) for f in fs)

    def train(spec, seen=None, reads=None):
        torch.manual_seed(0)
        p = prepare(GPT(GPTConfig.tiny(**CFG)), lambda ps: torch.optim.AdamW(ps, lr=1e-2), spec)
        losses, per_step = [], []
        data = list(batches(TextDataset(32), 8, p.dp_rank, p.dp_size, seed=1, steps=STEPS + 1))
        for b in data[:STEPS]:
            before = dict(reads or {})
            losses.append(p.train_step(b))
            if seen is not None:
                seen.update(files())
            if reads is not None:
                per_step.append({k: reads[k] - before[k] for k in reads})
        out = {"losses": losses, "notes": list(p.layout["notes"]), "reads": per_step}
        if seen is not None:
            # the parameters as they wait on disk, spoiled: a step that reads them from there takes NaNs
            _poison(os.path.join(folder, f) for f in files() if f"/rank{rank}/" in f and f.endswith("param.tensor.swp"))
            dist.barrier()
            out["after_poison"] = p.train_step(data[STEPS])
        p.close()
        return out

    out = {"rank": rank}
    out["plain"] = train("zero stage=3")["losses"]
    seen: set[str] = set()
    reads = _count_reads()
    nvme = train(NVME.format(folder), seen, reads)
    out["nvme"], out["notes"], out["reads"] = nvme["losses"], nvme["notes"], nvme["reads"]
    out["after_poison_finite"] = math.isfinite(nvme["after_poison"])
    out["seen"] = sorted(seen)
    dist.barrier()  # both ranks closed their engines
    out["after"] = os.listdir(folder)
    # a folder that cannot be made (under a file): refused before DeepSpeed builds anything
    torch.manual_seed(0)
    model = GPT(GPTConfig.tiny())
    before = [q.detach().clone() for q in model.parameters()]
    try:
        prepare(model, lambda ps: torch.optim.AdamW(ps), NVME.format(os.path.join(blocked, "swap")))
        out["refusal"] = None
    except PrepareError as e:
        out["refusal"] = str(e)
    out["untouched"] = all(type(q) is torch.nn.Parameter for q in model.parameters()) and all(
        torch.equal(a, b) for a, b in zip(before, model.parameters())
    )
    return out


def test_nvme_offload_on_cpu_ranks_trains_like_plain_zero3_reading_its_state_from_disk(tmp_path):
    folder, blocked = tmp_path / "nvme", tmp_path / "a-file"
    folder.mkdir()
    blocked.write_text("not a folder")
    res = run_ranks(nvme_against_plain, 2, args=(str(folder), str(blocked)), timeout=1200)
    for r in res:
        assert len(r["nvme"]) == len(r["plain"]) == STEPS
        rel = [abs(a - b) / abs(b) for a, b in zip(r["nvme"], r["plain"])]
        assert max(rel) <= REL, rel
        assert r["plain"][-1] < r["plain"][0] - 1.0  # it learns: the comparison is not of two flat lines
        mine = [f for f in r["seen"] if f"/rank{r['rank']}/" in f]
        params = [f for f in mine if f.startswith("zero_stage_3/float32params/") and f.endswith("_param.tensor.swp")]
        assert len(params) == 6, mine  # w1, w2, w3 of both blocks: 1 MiB per rank each
        optim = {f.rsplit("/", 1)[1].split("-")[0] for f in mine if f.startswith("zero_stage_3/optimizer/")}
        assert {"exp_avg", "exp_avg_sq"} <= optim, mine  # Adam's state went to disk
        # read back from disk in every step: the six parameter shards (forward, and again for backward)
        # and the optimizer partition's state
        assert all(s["params"] >= 6 and s["optimizer"] >= 1 for s in r["reads"]), r["reads"]
        # and what was read is what the step used: with the files spoilt, the next step's loss is NaN
        assert not r["after_poison_finite"]
        assert any("ZeRO-Infinity: swap files under" in n for n in r["notes"]), r["notes"]
        assert r["after"] == []  # DeepSpeed's files removed at close; the folder itself stays
        assert r["refusal"] == (
            f"nvme_path={str(blocked / 'swap')!r}: cannot create the folder (Not a directory); "
            "give a folder this rank can write"
        )
        assert r["untouched"]
    assert res[0]["nvme"] == res[1]["nvme"]  # the loss is averaged over ranks: the same on both
