"""What JupyterLab's debugger costs a cell on the ranks.

Target: a cell on 2 ranks with the debugger on and no breakpoint set takes at most 1.1x its
time with the debugger off (a pure-Python loop and a torch loop; the cost with breakpoints is
reported). Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/debugger_bench.py``
(``--quick``: checks the script only; ``--pool``: every saved run). Results:
``benchmarks/results/debugger-*.json``; the exit status is 1 when a target is missed."""

from __future__ import annotations

import argparse
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("IPYTHONDIR", str(ROOT / ".state" / "bench" / "ipython"))
os.makedirs(os.environ["IPYTHONDIR"], exist_ok=True)
sys.path.insert(0, str(ROOT / "benchmarks"))
import results  # noqa: E402

SETUP = "import torch\nm = torch.nn.Sequential(*[torch.nn.Linear(64, 64) for _ in range(4)])\nx = torch.randn(32, 64)\n"
CELLS = {
    "python": "def f(i):\n    return i + 1\ns = 0\nfor i in range(200000):\n    s = f(s)\n",
    "torch": "for _ in range(200):\n    m(x).sum().backward()\n",
}
MODES = ("off", "on", "elsewhere", "in cell")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=7, help="runs of each cell in each way")
    parser.add_argument("--quick", action="store_true", help="one round: checks the script only")
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    args = parser.parse_args(argv)
    if args.pool:
        return results.pool_report("debugger")
    if args.quick:
        args.rounds = 1
    run = results.Run("debugger", vars(args), quick=args.quick)

    from workbench.notebook.cluster import RankSet
    from workbench.notebook.debugger import hub
    from workbench.shared import debug_wire

    rs = RankSet.start(n=2, backend="gloo", threads=1)
    try:
        link = hub.of(rs).link
        rs.execute(SETUP)
        times: dict[tuple[str, str], list[float]] = {}
        for i in range(args.rounds):
            for cell, code in CELLS.items():
                origin = debug_wire.CellOrigin(f"/notebook/{cell}.py", 1)
                never = debug_wire.Breakpoint(origin.path, len(code.splitlines()) + 2)
                debugs = {
                    "off": None,
                    "on": debug_wire.CellDebug(link=link, origin=origin, visual=True),
                    "elsewhere": debug_wire.CellDebug(
                        link=link, origin=origin, visual=True, breakpoints=(debug_wire.Breakpoint("/nowhere.py", 1),)
                    ),
                    "in cell": debug_wire.CellDebug(link=link, origin=origin, visual=True, breakpoints=(never,)),
                }
                order = MODES if i % 2 == 0 else MODES[::-1]
                for mode in order:
                    t0 = time.perf_counter()
                    rs.execute_async(code, debug=debugs[mode]).result(timeout=600)
                    elapsed = time.perf_counter() - t0
                    times.setdefault((cell, mode), []).append(elapsed)
                    run.rounds.append({"round": i, "cell": cell, "mode": mode, "seconds": round(elapsed, 4)})
    finally:
        rs.stop()
    summary = {}
    for cell in CELLS:
        off = statistics.median(times[(cell, "off")])
        summary[cell] = {mode: round(statistics.median(times[(cell, mode)]), 4) for mode in MODES}
        for mode in MODES[1:]:
            ratio = statistics.median(times[(cell, mode)]) / off
            summary[cell][f"{mode} / off"] = round(ratio, 2)
            print(f"{cell:6s} {mode:9s} {statistics.median(times[(cell, mode)]):.3f} s  ({ratio:.2f}x off)")
        run.target(f"{cell} cell, debugger on without breakpoints / off", summary[cell]["on / off"], "<=", 1.1)
    run.summary = summary
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
