"""GPU benchmark: the workbench trainer on one GPU against a plain hand-written loop.

Target: tokens/s of the trainer / the plain loop >= 0.97, with ``torch.compile`` off and on;
MFU beside it (the method: docs/figures.md). Run ``python benchmarks/gpu_bench.py`` on a CUDA
machine (``make gpu-check`` runs it; ``--budget-s S`` cuts the rounds to fit); without CUDA it
says so and exits 0, and ``--quick`` only checks the script on any device. Results:
``benchmarks/results/gpu-*.json``; exit status 1 on a missed target."""

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

TARGET_RATIO = 0.97


def gpu_machine() -> dict:
    """What a reader needs to place a GPU figure: the GPU, its count and the software stack."""
    import torch

    info = {"cuda_available": torch.cuda.is_available(), "torch_cuda": torch.version.cuda}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(
            gpu=torch.cuda.get_device_name(0),
            gpu_count=torch.cuda.device_count(),
            gpu_memory_gib=round(props.total_memory / 2**30, 1),
            gpu_capability=f"{props.major}.{props.minor}",
            cudnn=torch.backends.cudnn.version(),
            nccl=".".join(map(str, torch.cuda.nccl.version())),
        )
    return info


def bootstrap(cuda: bool) -> str:
    """Make this process a world-size-1 workbench rank (NCCL on GPU 0, gloo on CPU)."""
    from workbench.engine import runtime

    info = runtime.bootstrap(
        rank=0,
        world_size=1,
        local_rank=0,
        local_world_size=1,
        master_addr="127.0.0.1",
        master_port=runtime.free_port(),
        backend="nccl" if cuda else "gloo",
        timeout_s=120,
        threads=int(os.environ.get("OMP_NUM_THREADS") or 4),
        # GPU 0, or the first of an existing CUDA_VISIBLE_DEVICES (runtime.visible_gpu)
        gpu_ids=[0] if cuda and not os.environ.get("CUDA_VISIBLE_DEVICES") else None,
        pin_visible_gpu=cuda,
    )
    return info["device"]


def build(cfg, dtype, device: str, compiled: bool):
    """A fresh model (seed 0: both sides start from the same weights) and its AdamW."""
    import torch

    from workbench.models import GPT

    torch.manual_seed(0)
    model = GPT(cfg).to(device=device, dtype=dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    return (torch.compile(model) if compiled else model), opt


def plain_steps(model, opt, pool, start: int, n: int) -> list[float]:
    """The hand-written loop: what a user writes without the workbench."""
    import torch

    from workbench.strategies.base import lm_loss

    losses = []
    for i in range(start, start + n):
        x, y = pool[i % len(pool)]
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(model(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
    return losses


def trainer_steps(trainer, n: int) -> None:
    trainer.start(n)
    status = trainer.wait(600)
    if status["state"] != "finished":
        raise RuntimeError(f"the trainer did not finish its {n} steps: {status['state']} ({status['reason']})")


def measure(args, compiled: bool, device: str) -> dict:
    """Both sides for ``args.rounds`` rounds of ``args.steps`` steps; per-round tokens/s."""
    import torch

    from workbench.engine import telemetry
    from workbench.engine.trainer import Trainer
    from workbench.models import GPTConfig
    from workbench.planner.flops import training_flops_per_token

    cfg = GPTConfig.tiny() if args.quick else GPTConfig.m100(n_layers=args.layers, max_seq_len=args.seq)
    seq = cfg.max_seq_len
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    cuda = device.startswith("cuda")
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    g = torch.Generator().manual_seed(1)
    pool = []
    for _ in range(8):
        tok = torch.randint(0, cfg.vocab, (args.batch, seq + 1), generator=g)
        pool.append((tok[:, :-1].contiguous().to(device), tok[:, 1:].contiguous().to(device)))
    tokens_per_step = args.batch * seq

    plain_model, plain_opt = build(cfg, dtype, device, compiled)
    tr_model, tr_opt = build(cfg, dtype, device, compiled)
    if compiled:  # compile on this thread (the trainer's thread then reuses the graphs): one
        # forward and backward, gradients dropped, weights untouched
        from workbench.strategies.base import lm_loss

        x, y = pool[0]
        lm_loss(tr_model(x), y).backward()
        tr_opt.zero_grad(set_to_none=True)
    reported: list[dict] = []
    trainer = Trainer(model=tr_model, optimizer=tr_opt, data=lambda i: pool[i % len(pool)], grad_clip=1.0)
    trainer.add_hook(reported.append, pauses=False)

    t = time.perf_counter()
    plain_steps(plain_model, plain_opt, pool, 0, args.warmup)
    sync()
    warm_plain = time.perf_counter() - t
    t = time.perf_counter()
    trainer_steps(trainer, args.warmup)
    sync()
    warm_trainer = time.perf_counter() - t

    rounds = []
    done = args.warmup
    for r in range(args.rounds):
        if rounds and args.deadline is not None:  # a time budget: stop before a round that would overrun it
            last = rounds[-1]["plain_s"] + rounds[-1]["trainer_s"]
            if time.monotonic() + 1.5 * last > args.deadline:
                break
        row = {"round": r, "compile": compiled}
        for side in ("plain", "trainer") if r % 2 == 0 else ("trainer", "plain"):
            sync()
            t0 = time.perf_counter()
            if side == "plain":
                plain_steps(plain_model, plain_opt, pool, done, args.steps)
            else:
                trainer_steps(trainer, args.steps)
            sync()
            row[f"{side}_s"] = time.perf_counter() - t0
            row[f"{side}_tps"] = args.steps * tokens_per_step / row[f"{side}_s"]
        done += args.steps
        row["ratio"] = row["trainer_tps"] / row["plain_tps"]
        rounds.append(row)

    n_params = cfg.num_params()
    fpt = training_flops_per_token(n_params, cfg.n_layers, cfg.dim, cfg.max_seq_len)
    peak = telemetry.device_peak_flops(device, args.dtype)
    tps_plain = statistics.median(r["plain_tps"] for r in rounds)
    tps_trainer = statistics.median(r["trainer_tps"] for r in rounds)
    late = reported[args.warmup :]  # the trainer's own per-step figures after warm-up
    summary = {
        "compile": compiled,
        "params": n_params,
        "tokens_per_step": tokens_per_step,
        "flops_per_token": fpt,
        "peak_flops": peak,
        "warmup_s": {"plain": warm_plain, "trainer": warm_trainer},
        "plain_tps": tps_plain,
        "trainer_tps": tps_trainer,
        "ratio": statistics.median(r["ratio"] for r in rounds),
        "plain_mfu": tps_plain * fpt / peak if peak else None,
        "trainer_mfu": tps_trainer * fpt / peak if peak else None,
        "trainer_reported_tps": statistics.median(x["tps"] for x in late) if late else None,
        "trainer_reported_mfu": statistics.median(x["mfu"] for x in late) if late and peak else None,
        # where a missed target goes: the trainer's own phase figures (CUDA events on a GPU) and
        # the host time between its steps (wall per step less its step time: the device idle there)
        "trainer_reported_s": {
            k: statistics.median(x[f"time_{k}_s"] for x in late)
            for k in ("step", "data", "forward", "backward", "optimizer")
        }
        if late
        else None,
        "trainer_between_steps_s": (
            statistics.median(r["trainer_s"] for r in rounds) / args.steps
            - statistics.median(x["time_step_s"] for x in late)
        )
        if late
        else None,
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "rounds_run": len(rounds),
        "rounds_cut_by_budget": len(rounds) < args.rounds,
    }
    return {"rounds": rounds, "summary": summary}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--compile", choices=("off", "on", "both"), default="both", help="torch.compile (default both)")
    p.add_argument(
        "--dtype", choices=("bf16", "fp32"), default=None, help="parameter dtype (bf16; fp32 on --quick CPU)"
    )
    p.add_argument("--batch", type=int, default=None, help="sequences per step (default 8; 4 with --quick)")
    p.add_argument("--seq", type=int, default=1024, help="sequence length (default 1024)")
    p.add_argument("--layers", type=int, default=15, help="GPT blocks (default 15: ~130M parameters)")
    p.add_argument("--steps", type=int, default=None, help="steps per round (default 20; 3 with --quick)")
    p.add_argument("--warmup", type=int, default=None, help="warm-up steps per side (default 5; 2 with --quick)")
    p.add_argument("--rounds", type=int, default=None, help="rounds per side (default 5; 2 with --quick)")
    p.add_argument("--quick", action="store_true", help="a tiny model for a few steps: checks the script only")
    p.add_argument(
        "--budget-s",
        type=float,
        default=None,
        help="seconds this run may take: rounds stop where the next would overrun (at least one runs)",
    )
    args = p.parse_args(argv)
    for name in ("batch", "steps", "warmup", "rounds", "seq", "layers", "budget_s"):  # before torch's import
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    args.deadline = None if args.budget_s is None else time.monotonic() + args.budget_s
    import torch

    cuda = torch.cuda.is_available()
    if not cuda and not args.quick:
        print("gpu_bench: no CUDA GPU on this machine: nothing measured, no figure written (--quick checks the script)")
        return 0
    q = args.quick
    args.dtype = args.dtype or ("bf16" if cuda else "fp32")
    args.batch = args.batch or (4 if q else 8)
    args.steps = args.steps or (3 if q else 20)
    args.warmup = args.warmup or (2 if q else 5)
    args.rounds = args.rounds or (2 if q else 5)
    modes = {"off": [False], "on": [True], "both": [False, True]}[args.compile]
    if q:
        modes = [False]  # compiling a tiny model on CPU would take longer than all the rest
        args.seq, args.layers = 32, 2  # GPTConfig.tiny's, what --quick runs
    device = bootstrap(cuda)
    run = results.Run("gpu", {k: v for k, v in vars(args).items() if k != "deadline"}, quick=q)
    run.machine_before.update(gpu_machine(), device=device)
    try:
        for compiled in modes:
            out = measure(args, compiled, device)
            s = out["summary"]
            run.rounds.extend(out["rounds"])
            run.summary["compile_on" if compiled else "compile_off"] = s
            mfu = f", MFU trainer {s['trainer_mfu']:.3f} plain {s['plain_mfu']:.3f}" if s["plain_mfu"] else ""
            print(
                f"compile {'on ' if compiled else 'off'}: trainer {s['trainer_tps']:,.0f} tok/s, "
                f"plain {s['plain_tps']:,.0f} tok/s, ratio {s['ratio']:.3f}{mfu}"
            )
            run.target(f"trainer/plain tokens/s, compile {'on' if compiled else 'off'}", s["ratio"], ">=", TARGET_RATIO)
    finally:
        import torch.distributed as dist

        if dist.is_initialized():
            dist.destroy_process_group()
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
