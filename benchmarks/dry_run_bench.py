"""How long a dry run of a catalogue layout takes on this machine, and how close the planner is.

Each case is ``workbench.dry_run`` as a notebook calls it (the dry-run process started,
torch and transformers imported, the model built on the meta device, one process forked
per distinct rank position, one training step on fake tensors each), timed wall-clock
from the call to the report, ``--runs`` times; the median is the figure. Beside it, in the
same run: how many ranks the layout has and how many processes were built (the
alternative, one process per rank, is that many times the positions' work), and the
side-by-side with the planner (:mod:`workbench.planner.side_by_side`): the largest
difference of each position's parameter, gradient and optimizer bytes, and of its peak.

Cases (issue 49's targets): Llama 3 70B (a transformers config from the planner's
catalogue numbers) on 512 ranks, tp 8 x pp 8 x dp_shard 8 (FSDP2 bf16, 1F1B, 8 micro-
batches of one 8,192-token sequence): <= 60 s; Llama 3 8B on 64 ranks, tp 8 x dp_shard 8,
one sequence per data-parallel rank: <= 20 s. Model states within 2% of the planner's,
peak within 10%. The load average before and after each run is saved with it: other work
on the machine stretches the wall time (the dry run's positions are CPU-bound).

Results: ``benchmarks/results/dry_run-*.json`` (``summary.cases[name].positions`` holds the
last run's positions, which tests/unit/test_dry_run_planner.py sets beside the planner
again). ``--quick`` runs a 16-rank tiny layout once (checks the script only). Usage::

    OMP_NUM_THREADS=1 python benchmarks/dry_run_bench.py [--runs 3] [--cases 70b,8b] [--quick]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402

from workbench.notebook.dry_run import dry_run  # noqa: E402

CASES = {
    "70b": dict(build="70b", gpus=512, tp=8, pp=8, dp_shard=8, microbatches=8, limit_s=60.0),
    "8b": dict(build="8b", gpus=64, tp=8, dp_shard=8, limit_s=20.0),
}
QUICK = {"tiny": dict(build=None, gpus=16, tp=2, pp=2, dp_shard=4, microbatches=2, seq=64, limit_s=600.0)}
STATES, PEAK = 0.02, 0.10


def tiny_llama():
    from transformers import LlamaConfig

    return LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=512,
        tie_word_embeddings=False,
    )


def one(case: dict):
    kwargs = {k: v for k, v in case.items() if k not in ("build", "limit_s")}
    build = case["build"] or tiny_llama
    load = os.getloadavg()[0]
    t0 = time.perf_counter()
    report = dry_run(build, **kwargs)
    return time.perf_counter() - t0, load, report


def off(report) -> tuple[float, float]:
    """The largest |dry run / planner - 1| of the model states, and of the peak."""
    cmp = report.compare()
    states = cmp[cmp["term"].isin(["parameters", "gradients", "optimizer"])]
    peak = cmp[cmp["term"] == "peak"]
    return float((states["ratio"] - 1).abs().max()), float((peak["ratio"] - 1).abs().max())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--cases", default="70b,8b")
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    cases = QUICK if args.quick else {n: CASES[n] for n in args.cases.split(",")}
    runs = 1 if args.quick else args.runs
    run = results.Run("dry_run", vars(args), quick=args.quick)
    cases_out = {}
    for name, case in cases.items():
        times = []
        for i in range(runs):
            seconds, load, report = one(case)
            times.append(seconds)
            r = report.result
            run.rounds.append(
                {
                    "case": name,
                    "run": i,
                    "seconds": seconds,
                    "load_avg_1_before": round(load, 2),
                    "load_avg_1_after": round(os.getloadavg()[0], 2),
                    "processes": r.processes,
                    "ranks": r.world,
                    "parts": r.seconds,
                    "position_seconds": [p.seconds for p in r.positions],
                }
            )
            print(
                f"{name} run {i}: {seconds:.1f} s ({r.processes} processes for {r.world} ranks, load {load:.1f})",
                flush=True,
            )
        states_off, peak_off = off(report)
        median = statistics.median(times)
        cases_out[name] = {
            "median_s": median,
            "ranks": report.result.world,
            "processes": report.result.processes,
            "layout": report.layout.describe() if report.layout else None,
            "states_off": states_off,
            "peak_off": peak_off,
            "table": report.table().to_dict(orient="records"),
            "compare": report.compare().to_dict(orient="records"),
            "request": {k: v for k, v in case.items() if k != "limit_s" and k != "build"}
            | {"build": str(case["build"])},
            "result": report.result.to_dict(),
        }
        print(report.summary(), flush=True)
        run.target(f"{name}: median seconds of a dry run", median, "<=", case["limit_s"])
        if not args.quick:
            run.target(f"{name}: model states off the planner", states_off, "<=", STATES)
            run.target(f"{name}: peak off the planner", peak_off, "<=", PEAK)
    run.summary = {"cases": cases_out}
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
