"""fp8's numerics on CPU: emulated fp8 (torchao) against fp32 over 20 steps on two gloo ranks.

Runs the function of ``tests/ranks/test_fp8_nccl_ranks.py`` (fsdp2 fp32, fsdp2
``fp8=tensorwise``, tp ``fp8=rowwise``) and saves each run's losses and relative differences
from fp32 to ``benchmarks/results/fp8-emulated-parity-*.json``: a numerics figure, not a speed
one (emulation runs the matmuls in high precision). Run: ``python benchmarks/fp8_parity.py``."""

import json
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "ranks"), str(ROOT / "benchmarks")]

if __name__ == "__main__":
    import results
    from gloo_harness import run_ranks
    from test_fp8_nccl_ranks import fp8_on_two_ranks

    r = run_ranks(fp8_on_two_ranks, 2, timeout=900)[0]
    args = {"world": 2, "steps": 20, "model": "GPTConfig.tiny(dim=64, ffn_dim=128)", "lr": 1e-2}
    run = results.Run("fp8-emulated-parity", args)
    ref = r["fp32"]
    for name in ("fsdp2_tensorwise", "tp_rowwise"):
        rel = [abs(a - b) / b for a, b in zip(r[name], ref)]
        run.summary[name] = {
            "final": r[name][-1],
            "max_rel": max(rel),
            "max_rel_step": rel.index(max(rel)) + 1,
            "last_rel": rel[-1],
        }
    run.summary["fp32_final"] = ref[-1]
    run.rounds = [{"fp32": ref, "fsdp2_tensorwise": r["fsdp2_tensorwise"], "tp_rowwise": r["tp_rowwise"]}]
    print(json.dumps(run.summary, indent=1))
    print(run.save())
