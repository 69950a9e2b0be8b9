"""How long a checkpoint blocks training: async save vs sync save, and restore time.

For each model (tiny GPT, ~100M-parameter GPT) and world size (2, 4): real gloo ranks
(``RankSet``), the model sharded with FSDP2 and trained one step (so AdamW state
exists), then ``runs`` times each:

- sync save: the training thread is blocked for the whole save (write + commit);
- async save: blocked only while the state is copied to CPU memory; the write runs in
  the background (its total time is shown too);
- restore: ``load latest`` into the live model (DCP read + set_state_dict).

Blocked time is the slowest rank's. Medians over ``runs``. Target: async blocks <= 1/4
of sync. Usage::

    OMP_NUM_THREADS=1 python benchmarks/checkpoint_bench.py [--runs 3] [--models tiny,m100] [--ranks 2,4]
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workbench.checkpoint import api as ck  # noqa: E402
from workbench.cluster import RankSet  # noqa: E402

BUILD = """
import torch
from workbench.models import GPT, GPTConfig, batch_at, SyntheticDataset
from workbench.strategies import prepare
from workbench.engine import checkpoint_hooks as ch
torch.manual_seed(0)
_cfg = {"tiny": GPTConfig.tiny(), "m100": GPTConfig.m100(max_seq_len=64)}[{model!r}]
_prep = prepare(GPT(_cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-4), "fsdp2")
_state = ch.track(_prep)
_x = torch.randint(0, 256, (2, 16))
_prep.train_step((_x, _x))
_state.step = 1
_nparams = sum(p.numel() for p in _prep.unwrap().parameters())
"""


def bench(model: str, n: int, runs: int) -> dict:
    rs = RankSet.start(n=n, backend="gloo", threads=1)
    root = tempfile.mkdtemp(prefix=f"ckbench-{model}-{n}-")
    try:
        rs.execute(BUILD.replace("{model!r}", repr(model)), timeout=600)
        nparams = rs.pull("_nparams")[0]
        sync_b, async_b, async_total, load_t, size = [], [], [], [], 0
        for i in range(runs):
            info = ck.save(root=root, rankset=rs, tag=f"sync{i}")
            sync_b.append(info["blocked_s"])
            size = ck.list(root).iloc[-1]["size_mb"]
            t0 = time.perf_counter()
            info = ck.save(root=root, rankset=rs, tag=f"async{i}", async_=True)
            async_b.append(info["blocked_s"])
            ck.wait(rankset=rs)
            async_total.append(time.perf_counter() - t0)
            res = rs.apply(_load_latest, root)
            load_t.append(max(r["load_s"] for r in res))
            for name in (f"sync{i}", f"async{i}"):
                shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        med = statistics.median
        return {"model": model, "params": nparams, "ranks": n, "size_mb": size, "sync_s": med(sync_b),
                "async_blocked_s": med(async_b), "async_total_s": med(async_total), "restore_s": med(load_t)}
    finally:
        rs.stop()
        shutil.rmtree(root, ignore_errors=True)


def _load_latest(root):
    from workbench.checkpoint import catalog
    from workbench.engine import checkpoint_hooks as ch

    folder, _ = catalog.resolve(root, "latest")
    return ch.rank_load(folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--models", default="tiny,m100")
    p.add_argument("--ranks", default="2,4")
    a = p.parse_args(argv)
    rows = []
    for model in a.models.split(","):
        for n in (int(x) for x in a.ranks.split(",")):
            rows.append(bench(model, n, a.runs))
            r = rows[-1]
            print(f"# done {model} on {n} ranks", file=sys.stderr, flush=True)
    hdr = (f"{'model':<6} {'params':>11} {'ranks':>5} {'ckpt MB':>8} {'sync save s':>12} {'async blocks s':>15} "
           f"{'async/sync':>10} {'async write s':>14} {'restore s':>10}")
    print(f"checkpoint benchmark: FSDP2 + AdamW, gloo CPU ranks, median of {a.runs} runs")
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        ratio = r["async_blocked_s"] / r["sync_s"] if r["sync_s"] else float("nan")
        print(f"{r['model']:<6} {r['params']:>11,} {r['ranks']:>5} {r['size_mb']:>8.1f} {r['sync_s']:>12.3f} "
              f"{r['async_blocked_s']:>15.3f} {ratio:>10.2f} {r['async_total_s']:>14.3f} {r['restore_s']:>10.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
