"""GPU features benchmark: what fp8, CUDA graphs and compile per block buy on one GPU.

Each group's alternatives against its baseline in the same run (the method: docs/figures.md);
no targets, so the figures are reported, not judged. Run ``python
benchmarks/gpu_features_bench.py`` on a CUDA machine (``make gpu-check`` runs it with
``--budget-s``); without CUDA it exits 0, and ``--quick`` only checks the script. Results:
``benchmarks/results/gpu-features-*.json``."""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import results  # noqa: E402

# (group, label, spec); the first of a group is its baseline
CONFIGS = [
    ("fp8", "bf16", "none dtype=bf16 compile=true"),
    ("fp8", "fp8_tensorwise", "none dtype=bf16 compile=true fp8=tensorwise"),
    ("fp8", "fp8_rowwise", "none dtype=bf16 compile=true fp8=rowwise"),
    ("graphs", "eager", "none dtype=bf16"),
    ("graphs", "compile", "none dtype=bf16 compile=true"),
    ("graphs", "cuda_graphs", "none dtype=bf16 compile=reduce-overhead"),
    ("fsdp_compile", "fsdp2_eager", "fsdp2 dtype=bf16"),
    ("fsdp_compile", "fsdp2_compile", "fsdp2 dtype=bf16 compile=true"),
]
QUICK = [
    ("fp8", "fp32", "none"),
    ("fp8", "fp8_rowwise_emulated", "none fp8=rowwise fp8_emulate=true"),
]


def model_config(group: str, args):
    from workbench.models import GPTConfig

    if args.quick:
        return GPTConfig.tiny(dim=64, ffn_dim=128), 4, 32
    if group == "fp8":
        d = args.fp8_dim
        return GPTConfig(dim=d, n_layers=4, n_heads=d // 128, n_kv_heads=d // 128, max_seq_len=1024), 8, 1024
    if group == "graphs":
        return GPTConfig(dim=512, n_layers=8, n_heads=8, n_kv_heads=8, max_seq_len=128), 1, 128
    return GPTConfig.m100(n_layers=6, max_seq_len=512), 8, 512


def one_config(spec: str, group: str, args, device: str, deadline: float) -> dict:
    import torch

    from workbench.models import GPT
    from workbench.strategies import prepare

    cfg, batch, seq = model_config(group, args)
    torch.manual_seed(0)
    model = GPT(cfg)
    p = prepare(model, lambda ps: torch.optim.AdamW(ps, lr=3e-4), spec)
    g = torch.Generator().manual_seed(1)
    pool = []
    for _ in range(4):
        t = torch.randint(0, cfg.vocab, (batch, seq + 1), generator=g)
        pool.append((t[:, :-1].to(device), t[:, 1:].to(device)))
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    t0 = time.perf_counter()
    for i in range(args.warmup):
        p.train_step(pool[i % len(pool)])
    sync()
    warm = time.perf_counter() - t0
    rounds, losses = [], []
    for r in range(args.rounds):
        if r and time.time() + statistics.median(rounds) * args.steps > deadline:
            break
        sync()
        t = time.perf_counter()
        for i in range(args.steps):
            losses.append(p.train_step(pool[i % len(pool)]))
        sync()
        rounds.append((time.perf_counter() - t) / args.steps)
    peak = torch.cuda.max_memory_allocated() if device.startswith("cuda") else None
    p.close()
    del p, model
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    return {
        "spec": spec,
        "batch": batch,
        "seq": seq,
        "warmup_s": round(warm, 2),
        "step_s_rounds": rounds,
        "step_s": statistics.median(rounds),
        "tokens_per_s": batch * seq / statistics.median(rounds),
        "last_loss": losses[-1],
        "peak_bytes": peak,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=None, help="steps per round (default 10; 2 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps (default 5; 1 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per configuration (default 5; 1 with --quick)")
    p.add_argument("--fp8-dim", type=int, default=2048, help="model width of the fp8 group (a multiple of 128)")
    p.add_argument("--budget-s", type=float, default=None, help="stop starting configurations past this")
    p.add_argument("--quick", action="store_true", help="the fp8 group on a tiny model: checks the script only")
    args = p.parse_args(argv)
    if args.budget_s is not None and args.budget_s < 1:
        p.error("--budget-s must be at least 1 second")
    q = args.quick
    args.steps = args.steps or (2 if q else 10)
    args.warmup = args.warmup or (1 if q else 5)
    args.rounds = args.rounds or (1 if q else 5)
    import gpu_bench
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not q:
        print("gpu_features_bench: no CUDA GPU on this machine: nothing measured, no figure written")
        return 0
    start = time.time()
    deadline = start + (args.budget_s or 1e9)
    device = gpu_bench.bootstrap(cuda)
    run = results.Run("gpu-features", {k: v for k, v in vars(args).items()}, quick=q)
    skipped, failed, rows = [], [], {}
    for group, label, spec in QUICK if q else CONFIGS:
        left = deadline - time.time()
        if rows and left < 30:  # warm-up and one round of the next would not fit
            skipped.append(f"{label}: {left:.0f} s left of the budget")
            continue
        try:
            rows[label] = {"group": group, **one_config(spec, group, args, device, deadline)}
        except Exception as exc:  # one feature failing still leaves the others' figures
            failed.append(f"{label}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        base = next(lbl for g, lbl, _ in (QUICK if q else CONFIGS) if g == group)
        if base in rows:
            rows[label]["speedup_vs_" + base] = rows[base]["step_s"] / rows[label]["step_s"]
        print(f"{group:13s} {label:22s} {rows[label]['step_s'] * 1e3:8.2f} ms/step", flush=True)
    run.rounds = [{"label": k, **v} for k, v in rows.items()]
    run.summary = {
        "step_ms": {k: round(v["step_s"] * 1e3, 3) for k, v in rows.items()},
        "speedup": {k: round(s, 3) for k, v in rows.items() for n, s in v.items() if n.startswith("speedup_vs_")},
        "skipped": skipped,
        "failed": failed,
        "machine": gpu_bench.gpu_machine(),
        "wall_s": round(time.time() - start, 1),
    }
    import torch.distributed as dist

    dist.destroy_process_group()
    code = run.finish()
    return 1 if failed and not q else code


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(main())
