"""JAX ranks beside torch ranks: start-up, memory per rank, and the planner's bytes per rank.

Targets: a JAX set starts no slower than a torch set; planner / measured bytes == 1 under
FSDP- and TP-style layouts; memory reported beside them (the method: docs/figures.md).
Results: ``benchmarks/results/jax-*.json`` (``--pool``: every saved run; ``--quick``: checks
the script only). Usage::

    OMP_NUM_THREADS=1 python benchmarks/jax_bench.py [--ranks 4] [--rounds 3]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402

from workbench.notebook.cluster import RankSet  # noqa: E402
from workbench.planner import ModelSpec, PlanLayout  # noqa: E402
from workbench.planner.sharded_bytes import compare_param_bytes, shape_config  # noqa: E402

MODEL = ModelSpec(layers=4, hidden=256, heads=8, kv_heads=4, ffn=704, vocab=4096, seq_len=128, name="llama-tiny")


def _pss(rs: RankSet) -> int:
    """Proportional memory of the process that imported the framework and forked the ranks,
    and of the ranks: what the rank set costs the machine (pages shared by the fork counted once)."""
    import psutil

    parent = psutil.Process(rs.forked.pid)
    return sum(p.memory_full_info().pss for p in [parent, *parent.children(recursive=True)])


def one_start(framework: str, n: int) -> dict:
    t0 = time.perf_counter()
    kwargs = {"framework": "jax"} if framework == "jax" else {"backend": "gloo"}
    rs = RankSet.start(n=n, threads=1, **kwargs)
    try:
        seconds = time.perf_counter() - t0
        out = {"framework": framework, "start_s": seconds, "pss_bytes": _pss(rs)}
        if framework == "jax":
            out["bytes"] = planner_bytes(rs)
        return out
    finally:
        rs.stop()


def planner_bytes(rs: RankSet) -> dict:
    rs.push({"cfg": shape_config(MODEL)})
    plans = {"fsdp": PlanLayout(dp_shard=rs.world_size, zero_stage=3, precision="fp32"),
             "tp": PlanLayout(tp=rs.world_size, precision="fp32")}  # fmt: skip
    out = {}
    for style, plan in plans.items():
        rs.execute(
            "from workbench import engine\nfrom workbench.engine.jax_models import llama_params\n"
            f"lay = engine.describe_jax(llama_params(cfg, {style!r}), strategy='jax {style}')",
            timeout=300,
        )
        out[style] = compare_param_bytes(rs.pull("lay"), MODEL, plan)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--quick", action="store_true")
    p.add_argument("--pool", action="store_true")
    args = p.parse_args(argv)
    if args.pool:
        return results.pool_report("jax")
    rounds = 1 if args.quick else args.rounds
    run = results.Run(bench="jax", args=vars(args), quick=args.quick)
    for r in range(rounds):
        order = ("jax", "torch") if r % 2 == 0 else ("torch", "jax")
        row = {fw: one_start(fw, args.ranks) for fw in order}
        run.rounds.append(row)
        print(
            f"round {r + 1}: start jax {row['jax']['start_s']:.2f} s, torch {row['torch']['start_s']:.2f} s; "
            f"memory (PSS) of the set jax {row['jax']['pss_bytes'] / 2**20:.0f} MiB, "
            f"torch {row['torch']['pss_bytes'] / 2**20:.0f} MiB",
            flush=True,
        )
    med = lambda fw, key: statistics.median(x[fw][key] for x in run.rounds)  # noqa: E731
    last = run.rounds[-1]["jax"]["bytes"]
    run.summary = {
        "ranks": args.ranks,
        "model": MODEL.name,
        "jax_start_s": med("jax", "start_s"),
        "torch_start_s": med("torch", "start_s"),
        "jax_set_pss_mib": med("jax", "pss_bytes") / 2**20,
        "torch_set_pss_mib": med("torch", "pss_bytes") / 2**20,
        "bytes_per_rank": {s: [row["measured_bytes"] for row in rows] for s, rows in last.items()},
        "planner_bytes": {s: rows[0]["predicted_bytes"] for s, rows in last.items()},
    }
    print(run.summary)
    run.target("jax start / torch start", run.summary["jax_start_s"] / run.summary["torch_start_s"], "<=", 1.0)
    run.summary["jax_over_torch_pss"] = run.summary["jax_set_pss_mib"] / run.summary["torch_set_pss_mib"]
    for style, rows in last.items():
        run.target(f"planner / measured param bytes ({style})", max(abs(1 - 1 / r["ratio"]) for r in rows), "<=", 0.0)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
