"""How often a fault-tolerant run's last step re-forms its quorum while it waits for a lost replica.

Each try of the last step re-forms the quorum and reconfigures the replicas' gloo group:
trying once a replica asks the lighthouse (``_wait_for_a_joiner``) should reconfigure at most
1/5 as often per second of waiting as a fixed retry every 0.1 s, and wait no longer than 1.5x
its wait (medians; the method: docs/figures.md). Results: ``benchmarks/results/ft_last_step-*.json``::

    OMP_NUM_THREADS=1 python benchmarks/ft_last_step_bench.py [--rounds 3] [--steps 30] [--quick]"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

import results  # noqa: E402

RETRY_S = 0.1  # the alternative to the lighthouse wait: the last step retried at a fixed interval


def _arm(retry_s: float | None, die_at_last: bool) -> None:
    """On a rank: the next run's last-step wait (``retry_s``: the fixed retry), and whether this rank
    SIGKILLs itself as that run starts its last step."""
    from workbench.engine import fault_tolerant

    cls = fault_tolerant.FaultTolerantRun
    init = getattr(cls, "_bench_init", cls.__init__)
    step = getattr(cls, "_bench_step", cls._one_step)
    cls._bench_init, cls._bench_step = init, step

    def __init__(self, plan):
        init(self, {**plan, "last_step_retry_s": retry_s} if retry_s else plan)

    def one_step(self):
        if die_at_last and self.manager.current_step() == self.target - 1:
            os.kill(os.getpid(), signal.SIGKILL)
        return step(self)

    cls.__init__, cls._one_step = __init__, one_step


def one_round(rs, way: str, steps: int) -> dict:
    import ft_last_step_bench as me  # the ranks import it by name (not as __main__)

    from workbench.engine import fault_tolerant
    from workbench.notebook import training

    rs.apply(me._arm, RETRY_S if way == "retry" else None, False, ranks=[0])
    rs.apply(me._arm, None, True, ranks=[1])
    ft = training.fault_tolerant(steps, replicas=2, quorum_timeout=1.0)
    states = training.wait(timeout=300)
    if states != {0: "finished", 1: "finished"}:
        raise RuntimeError(f"round did not finish: {states}\n{ft.status_text()}")
    (s,) = rs.apply(fault_tolerant.status, ranks=[0])
    (rec,) = ft.records
    return {
        "way": way,
        "wait_rounds": s["wait_rounds"],
        "wait_s": s["wait_s"],
        "reconfigurations_per_s": s["wait_rounds"] / max(1e-9, s["wait_s"]),
        "restart_s": rec["restart_s"],
        "load_avg_1_5_15": [round(x, 2) for x in os.getloadavg()],
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each way")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--quick", action="store_true", help="one round of each: checks the script only")
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    args = parser.parse_args(argv)
    if args.pool:
        return results.pool_report("ft_last_step")
    from workbench.notebook import api

    rounds = 1 if args.quick else args.rounds
    run = results.Run("ft_last_step", vars(args), quick=args.quick)
    rs = api.start(2, backend="gloo", threads=1, sys_path=[str(HERE)])
    try:
        for r in range(rounds):
            for way in ("retry", "lighthouse") if r % 2 == 0 else ("lighthouse", "retry"):
                row = {"round": r, **one_round(rs, way, args.steps)}
                run.rounds.append(row)
                print(
                    f"round {r + 1}, {way}: {row['wait_rounds']} quorums in {row['wait_s']:.2f} s of waiting "
                    f"({row['reconfigurations_per_s']:.2f}/s)",
                    flush=True,
                )
    finally:
        api.stop()
    med = {
        way: {
            k: statistics.median(x[k] for x in run.rounds if x["way"] == way)
            for k in ("reconfigurations_per_s", "wait_s", "wait_rounds")
        }
        for way in ("retry", "lighthouse")
    }
    run.summary = {
        "what": "rank 0's last step waiting for a replaced replica: quorums re-formed, seconds",
        "median": med,
    }
    for way, m in med.items():
        print(f"{way}: median {m['reconfigurations_per_s']:.2f} reconfigurations/s over {m['wait_s']:.2f} s of waiting")
    run.target(
        "reconfigurations/s while the last step waits, lighthouse / retry",
        med["lighthouse"]["reconfigurations_per_s"] / med["retry"]["reconfigurations_per_s"],
        "<=",
        0.2,
    )
    run.target(
        "the last step's wait, lighthouse / retry", med["lighthouse"]["wait_s"] / med["retry"]["wait_s"], "<=", 1.5
    )
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
