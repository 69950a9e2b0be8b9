"""LoRA checkpoints against the full model's: bytes on disk, the base written once, save time.

One process (sizes do not depend on the ranks), a random-init Llama with peft LoRA at rank 8
and 16 (the method: docs/figures.md). Results: ``benchmarks/results/lora_checkpoint-*.json``::

    python benchmarks/lora_checkpoint_bench.py [--runs 3] [--quick]"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402

SHAPES = {
    "42m": dict(vocab_size=16000, hidden_size=512, intermediate_size=1536, num_hidden_layers=8),
    "tiny": dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2),
}


def folder_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def build(shape: str, lora_rank: int):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=128, **SHAPES[shape])
    model = LlamaForCausalLM(cfg)
    if lora_rank:
        from peft import LoraConfig, get_peft_model

        model = get_peft_model(model, LoraConfig(r=lora_rank, lora_alpha=2 * lora_rank, target_modules="all-linear"))
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    ids = torch.randint(0, cfg.vocab_size, (2, 32), generator=torch.Generator().manual_seed(1))
    model(input_ids=ids, labels=ids).loss.backward()
    opt.step()
    return model, opt


def measure(shape: str, lora_rank: int, runs: int) -> dict:
    from workbench.engine.checkpoint import save as ck
    from workbench.engine.checkpoint.state import Target, TrainState

    model, opt = build(shape, lora_rank)
    root = tempfile.mkdtemp(prefix="lora-bench-")
    try:
        target = Target(model=model, optimizer=opt, state=TrainState(step=1))
        t0 = time.perf_counter()
        first = ck.save(target, root, tag="first")
        first_s = time.perf_counter() - t0
        times = []
        for i in range(runs):
            t0 = time.perf_counter()
            ck.save(target, root, tag=f"again-{i}")
            times.append(time.perf_counter() - t0)
        bases = os.path.join(root, "bases")
        return {
            "shape": shape,
            "lora_rank": lora_rank,
            "params": sum(p.numel() for p in model.parameters()),
            "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad),
            "checkpoint_bytes": folder_bytes(os.path.join(root, "again-0")),
            "base_bytes": folder_bytes(bases) if os.path.isdir(bases) else 0,
            "bases_written": len(os.listdir(bases)) if os.path.isdir(bases) else 0,
            "first_save_s": first_s,
            "save_s_median": statistics.median(times),
            "first": first["name"],
        }
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3, help="saves of each kind after the first (median)")
    p.add_argument("--quick", action="store_true", help="the tiny model, 1 run: checks the script only")
    a = p.parse_args(argv)
    if a.runs < 1:
        p.error(f"--runs {a.runs}: give at least 1")
    shape = "tiny" if a.quick else "42m"
    runs = 1 if a.quick else a.runs
    run = results.Run("lora_checkpoint", vars(a), quick=a.quick)
    full = measure(shape, 0, runs)
    run.rounds.append(full)
    print(
        f"full model ({full['params']:,} params): checkpoint {full['checkpoint_bytes'] / 2**20:.2f} MiB, "
        f"save {full['save_s_median']:.3f} s"
    )
    for rank in (8, 16):
        row = measure(shape, rank, runs)
        row["fraction_of_full"] = row["checkpoint_bytes"] / full["checkpoint_bytes"]
        row["save_s_ratio_to_full"] = row["save_s_median"] / full["save_s_median"]
        run.rounds.append(row)
        print(
            f"LoRA r={rank} ({row['trainable']:,} trainable): checkpoint {row['checkpoint_bytes'] / 2**20:.2f} MiB "
            f"= {row['fraction_of_full']:.4f} of the full model's; base once {row['base_bytes'] / 2**20:.2f} MiB "
            f"({row['bases_written']} written for {runs + 1} saves); save {row['save_s_median']:.3f} s "
            f"({row['save_s_ratio_to_full']:.3f} of the full model's), first save {row['first_save_s']:.3f} s"
        )
    r16 = run.rounds[-1]
    run.summary = {"fraction_r16": r16["fraction_of_full"], "fraction_r8": run.rounds[1]["fraction_of_full"]}
    run.target("LoRA r=16 checkpoint / full model checkpoint", r16["fraction_of_full"], "<=", 0.1)
    run.target("bases written for every save", r16["bases_written"], "<=", 1)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
