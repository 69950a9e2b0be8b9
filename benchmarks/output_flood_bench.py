"""What a flood of printed output costs: a ``%%distrain`` cell on 4 ranks printing 200,000 lines
each (kept: a head and a tail per rank; every line into the ranks' log files) against the same
loop printing to /dev/null on the ranks, in turns.

Target: the flood cell's median time <= 1.5x the /dev/null cell's; beside it, the characters the
cell shows, and the same flood with ``--output all`` (everything into the notebook): its time,
characters and the notebook process's growth. Run:
``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/output_flood_bench.py`` (``--quick``: checks the
script only; ``--pool``: every saved run). Results: ``benchmarks/results/output_flood-*.json``."""

from __future__ import annotations

import argparse
import gc
import io
import os
import pathlib
import statistics
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("IPYTHONDIR", str(ROOT / ".state" / "bench" / "ipython"))
os.makedirs(os.environ["IPYTHONDIR"], exist_ok=True)
sys.path.insert(0, str(ROOT / "benchmarks"))
import results  # noqa: E402

LINE = "f'step {i} loss 0.123456 lr 3e-4 some more text here'"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=4, help="ranks")
    parser.add_argument("--lines", type=int, default=200_000, help="lines each rank prints per cell")
    parser.add_argument("--repeats", type=int, default=7, help="cells of each kind, in turns")
    parser.add_argument("--quick", action="store_true", help="2 ranks, 2,000 lines, 2 turns: checks the script only")
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    args = parser.parse_args(argv)
    if args.pool:
        return results.pool_report("output_flood")
    if args.quick:
        args.n, args.lines, args.repeats = 2, 2_000, 2
    run = results.Run("output_flood", vars(args), quick=args.quick)

    import psutil
    from IPython.testing.globalipapp import get_ipython

    import workbench

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    with redirect_stdout(io.StringIO()):
        ip.run_line_magic("distrain", f"start -n {args.n} --backend gloo --threads 1")
    cells = {
        "flood": f"for i in range({args.lines}):\n    print({LINE})\n",
        "devnull": (
            f"import os\n_devnull = open(os.devnull, 'w')\nfor i in range({args.lines}):\n"
            f"    print({LINE}, file=_devnull)\n_devnull.flush()\n"
        ),
    }
    shown: list[int] = []

    def cell(code: str, flags: str = "") -> float:
        out, err = io.StringIO(), io.StringIO()
        t0 = time.perf_counter()
        with redirect_stdout(out), redirect_stderr(err):
            assert ip.run_cell(f"%%distrain {flags}\n" + code).success, err.getvalue()[-2000:]
        took = time.perf_counter() - t0
        shown.append(len(out.getvalue()) + len(err.getvalue()))
        return took

    try:
        for code in cells.values():  # warm up both
            cell(code)
        times: dict[str, list[float]] = {k: [] for k in cells}
        for turn in range(args.repeats):
            for name, code in cells.items() if turn % 2 == 0 else reversed(cells.items()):
                times[name].append(cell(code))
        kept = max(shown)
        everything = {"seconds": [], "chars": [], "notebook_growth_mib": []}
        for _ in range(min(3, args.repeats)):  # --output all: everything into the notebook
            gc.collect()
            rss0 = psutil.Process().memory_info().rss
            everything["seconds"].append(cell(cells["flood"], "--output all"))
            everything["notebook_growth_mib"].append((psutil.Process().memory_info().rss - rss0) / 2**20)
            everything["chars"].append(shown[-1])
    finally:
        workbench.stop()
    med = {k: statistics.median(v) for k, v in times.items()}
    ratio = med["flood"] / med["devnull"]
    run.rounds = [{"cell": k, "seconds": v} for k, v in times.items()] + [{"cell": "output all", **everything}]
    run.summary = {
        "median_s": med,
        "ratio": ratio,
        "flood_shown_chars": kept,
        "output_all": {k: statistics.median(v) for k, v in everything.items()},
        "lines_per_rank": args.lines,
        "ranks": args.n,
    }
    print(
        f"flood {med['flood']:.3f} s, /dev/null {med['devnull']:.3f} s (medians of {args.repeats}): "
        f"{ratio:.2f}x; at most {kept:,} characters shown. With --output all: "
        f"{statistics.median(everything['seconds']):.2f} s, {statistics.median(everything['chars']):,.0f} characters, "
        f"notebook +{statistics.median(everything['notebook_growth_mib']):.0f} MiB"
    )
    run.target("flood / devnull (median cell time)", ratio, "<=", 1.5)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
