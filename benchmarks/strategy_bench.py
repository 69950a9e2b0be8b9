"""Strategy benchmark: the workbench's live ranks against a plain ``torchrun`` script.

For each strategy on 2 and 4 CPU ranks, the same model, data and step function run
(a) on the workbench's ranks (ipyparallel engines, ``engine.prepare``) and (b) as a
plain script under ``torch.distributed.run``. Each side reports its median step time
and per-rank memory (USS after ``malloc_trim``); the ratio workbench / torchrun of
the step time is the figure of merit (target at most 1.03). Runs alternate between
the two sides so that both see the same machine load.

Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/strategy_bench.py``
(``--quick`` for one world size and fewer strategies).
"""
from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
STRATEGIES = {2: ["ddp", "fsdp2", "zero", "tp", "pp"], 4: ["ddp", "fsdp2", "zero", "tp", "fsdp2_tp", "pp"]}
SPECS = {"ddp": "ddp", "fsdp2": "fsdp2", "zero": "zero zero_stage=2", "tp": "tp", "fsdp2_tp": "fsdp2_tp tp=2",
         "pp": "pp pp_schedule=1f1b"}


def measure(spec: str, steps: int, warmup: int, dim: int) -> dict:
    """On one rank: prepare the model with ``spec`` and time ``steps`` training steps.

    Self-contained (imports inside) because it is shipped to the ranks by value.
    """
    import ctypes
    import gc
    import statistics
    import time

    import psutil
    import torch
    import torch.distributed as dist

    from workbench.models import GPT, GPTConfig, TextDataset, batch_at
    from workbench.strategies import prepare

    torch.manual_seed(0)
    cfg = GPTConfig.tiny(dim=dim, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=4 * dim, max_seq_len=64)
    model = GPT(cfg)
    prepared = prepare(model, lambda params: torch.optim.AdamW(params, lr=1e-3), spec)
    data = TextDataset(seq_len=64)
    times = []
    for step in range(warmup + steps):
        batch = batch_at(data, 8, step, dp_rank=prepared.dp_rank, dp_size=prepared.dp_size)
        dist.barrier()
        t0 = time.perf_counter()
        prepared.train_step(batch)
        times.append(time.perf_counter() - t0)
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    uss = psutil.Process().memory_full_info().uss
    close = getattr(prepared, "close", None)
    if close:
        close()
    return {"step_s": statistics.median(times[warmup:]), "uss": uss, "rank": dist.get_rank()}


def worker_main(args) -> None:
    """Entry point under torchrun: one rank of the plain-script side."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    result = measure(SPECS[args.worker], args.steps, args.warmup, args.dim)
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.destroy_process_group()


def torchrun(kind: str, n: int, args) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={n}",
           str(pathlib.Path(__file__)), "--worker", kind, "--steps", str(args.steps),
           "--warmup", str(args.warmup), "--dim", str(args.dim)]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"torchrun {kind} x{n} failed:\n{out.stderr[-3000:]}")


def workbench_run(rs, kind: str, args) -> list[dict]:
    results = rs.apply(measure, SPECS[kind], args.steps, args.warmup, args.dim)
    rs.execute("import gc; gc.collect()")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument("--quick", action="store_true", help="world 2, ddp and fsdp2 only, 2 repeats")
    args = parser.parse_args()
    if args.worker:
        return worker_main(args)
    os.environ.setdefault("IPYTHONDIR", str(ROOT / ".state" / "bench" / "ipython"))
    sys.path.insert(0, str(ROOT))
    import workbench

    worlds = [2] if args.quick else [int(w) for w in args.worlds.split(",")]
    rows = []
    repeats = 2 if args.quick else args.repeats
    for n in worlds:
        kinds = ["ddp", "fsdp2"] if args.quick else STRATEGIES[n]
        rs = workbench.start(n, backend="gloo", threads=1, sys_path=(str(HERE),))
        try:
            for kind in kinds:
                wb_times, tr_times, wb_mem, tr_mem = [], [], [], []
                for _ in range(repeats):
                    tr = torchrun(kind, n, args)
                    wb = workbench_run(rs, kind, args)
                    tr_times.append(max(r["step_s"] for r in tr))
                    wb_times.append(max(r["step_s"] for r in wb))
                    tr_mem.append(max(r["uss"] for r in tr))
                    wb_mem.append(max(r["uss"] for r in wb))
                row = {"world": n, "strategy": kind,
                       "torchrun_ms": statistics.median(tr_times) * 1e3,
                       "workbench_ms": statistics.median(wb_times) * 1e3,
                       "torchrun_uss_mb": statistics.median(tr_mem) / 2**20,
                       "workbench_uss_mb": statistics.median(wb_mem) / 2**20}
                row["ratio"] = row["workbench_ms"] / row["torchrun_ms"]
                rows.append(row)
                print(f"  {kind:>9} x{n}: workbench {row['workbench_ms']:7.1f} ms  torchrun "
                      f"{row['torchrun_ms']:7.1f} ms  ratio {row['ratio']:.3f}", flush=True)
        finally:
            workbench.stop()
    print()
    print(f"median step time (slowest rank) and per-rank USS, {repeats} alternating runs of "
          f"{args.steps} steps; GPT dim {args.dim}, 4 layers, seq 64, batch 8; cpu count {os.cpu_count()}")
    print(f"{'world':>5} {'strategy':>9} {'workbench ms':>13} {'torchrun ms':>12} {'ratio':>6} "
          f"{'wb USS MB':>10} {'tr USS MB':>10}")
    for r in rows:
        print(f"{r['world']:>5} {r['strategy']:>9} {r['workbench_ms']:>13.1f} {r['torchrun_ms']:>12.1f} "
              f"{r['ratio']:>6.3f} {r['workbench_uss_mb']:>10.0f} {r['torchrun_uss_mb']:>10.0f}")
    print("target: ratio <= 1.03 (workbench step time over plain torchrun)")


if __name__ == "__main__":
    main()
