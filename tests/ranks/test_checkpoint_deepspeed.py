"""DeepSpeed ZeRO checkpoints go through the same DCP format: ZeRO-2 -> DDP and DDP -> ZeRO-3.

Fresh gloo processes (``gloo_harness``): DeepSpeed picks its accelerator once per process.
"""

from __future__ import annotations

import pytest

pytest.importorskip("deepspeed")
pytestmark = pytest.mark.slow  # two fresh process sets per case, each importing DeepSpeed

from gloo_harness import run_ranks  # noqa: E402


def _run(rank, world, spec, root, load, steps_before, steps_after):
    import os

    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch

    from workbench.engine.checkpoint import load as ck_load
    from workbench.engine.checkpoint import save as ck_save
    from workbench.engine.checkpoint.state import target_from_prepared
    from workbench.models import GPT, GPTConfig, SyntheticDataset, batch_at
    from workbench.shared.checkpoint import catalog
    from workbench.strategies import prepare

    torch.manual_seed(0)
    p = prepare(GPT(GPTConfig.tiny()), lambda ps: torch.optim.AdamW(ps, lr=1e-2), spec)
    t = target_from_prepared(p)
    ds = SyntheticDataset("copy", n=256, seq_len=16)
    losses = {}

    def train(n):
        for _ in range(n):
            s = t.state.step
            losses[s] = p.train_step(batch_at(ds, 8, s, dp_rank=p.dp_rank, dp_size=p.dp_size))
            t.state.step += 1

    if load:
        ck_load.load(t, catalog.resolve(root, "latest")[0])
        train(steps_after)
    else:
        train(steps_before)
        ck_save.save(t, root)
        train(steps_after)
    p.close()
    return losses


def close(a, b, rel=1e-4):
    return abs(a - b) <= rel * max(abs(a), abs(b))


@pytest.mark.parametrize("src,dst", [("zero zero_stage=2", "ddp"), ("ddp", "zero zero_stage=3")])
def test_deepspeed_checkpoint_reshards_across_strategies(tmp_path, src, dst):
    root = str(tmp_path)
    ref = run_ranks(_run, 2, args=(src, root, False, 3, 2), timeout=300)[0]
    got = run_ranks(_run, 2, args=(dst, root, True, 0, 2), timeout=300)[0]
    assert sorted(got) == [3, 4]
    for s in (3, 4):
        assert close(got[s], ref[s]), (src, dst, s, got[s], ref[s])
