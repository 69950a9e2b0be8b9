"""What the ranks' flight record and output log cost where nothing hangs or floods, in turns.

Targets: the record's own cost per collective (its enter and leave, timed alone in turns with
the collective) <= 5% of a one-float ``all_reduce`` on 2 gloo ranks (the smallest collective,
where it weighs most; the collective with and without it, whose difference is lost in the
noise of a loaded machine, is kept beside it); a trivial ``%%distrain`` cell on 4 ranks with
the record and the log in place <= 1.05x the same cell with both taken off the ranks. Run:
``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/flight_record_bench.py`` (``--quick``: checks the
script only; ``--pool``: every saved run). Results: ``benchmarks/results/flight_record-*.json``."""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import statistics
import sys
import time
from contextlib import redirect_stdout

ROOT = pathlib.Path(__file__).resolve().parents[1]
os.environ.setdefault("IPYTHONDIR", str(ROOT / ".state" / "bench" / "ipython"))
os.makedirs(os.environ["IPYTHONDIR"], exist_ok=True)
sys.path.insert(0, str(ROOT / "benchmarks"))
import results  # noqa: E402

# on each rank, in lockstep, each turn: `calls` one-float all_reduces with the record kept, the same
# with it paused, and the record's own enter/leave alone (no collective): seconds per call of each
COLLECTIVES = """
import time, torch, torch.distributed as dist
from workbench.engine import flight_record
_t = torch.ones(1)
_per_call = {{"kept": [], "paused": [], "record": []}}
for _turn in range({turns}):
    for _mode in (("kept", "paused", "record") if _turn % 2 == 0 else ("record", "paused", "kept")):
        dist.barrier()
        _t0 = time.perf_counter()
        if _mode == "record":
            for _ in range({calls}):
                flight_record.leave(flight_record.enter("all_reduce", None, _t, "one", 4))
        else:
            with flight_record.paused(_mode == "paused"):
                for _ in range({calls}):
                    dist.all_reduce(_t)
        _per_call[_mode].append((time.perf_counter() - _t0) / {calls})
"""
TAKE_OFF = """
from workbench.engine import flight_record, rank_log
_log_folder = __import__("os").path.dirname(rank_log.current_path())
rank_log.uninstall()
_paused = flight_record.paused()
_paused.__enter__()
"""
PUT_BACK = """
rank_log.install(_log_folder, __import__("workbench.engine.runtime", fromlist=["x"]).context().rank)
_paused.__exit__(None, None, None)
"""


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=7, help="turns of the collective comparison")
    parser.add_argument("--calls", type=int, default=3000, help="all_reduces per turn and mode")
    parser.add_argument("--cells", type=int, default=150, help="trivial cells of each kind, in turns")
    parser.add_argument("--quick", action="store_true", help="a few of each: checks the script only")
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    args = parser.parse_args(argv)
    if args.pool:
        return results.pool_report("flight_record")
    if args.quick:
        args.turns, args.calls, args.cells = 2, 50, 5
    run = results.Run("flight_record", vars(args), quick=args.quick)

    from IPython.testing.globalipapp import get_ipython

    import workbench

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")

    with redirect_stdout(io.StringIO()):
        ip.run_line_magic("distrain", "start -n 2 --backend gloo --threads 1")
    try:
        rs = workbench.current()
        rs.execute(COLLECTIVES.format(turns=args.turns, calls=args.calls), timeout=600)
        per_call = rs.pull("_per_call")
    finally:
        workbench.stop()
    kept, paused, record = (statistics.median(t for r in per_call for t in r[k]) for k in ("kept", "paused", "record"))

    with redirect_stdout(io.StringIO()):
        ip.run_line_magic("distrain", "start -n 4 --backend gloo --threads 1")
    cell_s: dict[str, list[float]] = {"with": [], "without": []}
    try:
        rs = workbench.current()

        def cell() -> float:
            with redirect_stdout(io.StringIO()):
                t0 = time.perf_counter()
                ip.run_cell_magic("distrain", "", "pass")
                return time.perf_counter() - t0

        for _ in range(10):
            cell()
        for turn in range(args.cells):
            for mode in ("with", "without") if turn % 2 == 0 else ("without", "with"):
                if mode == "without":
                    rs.execute(TAKE_OFF, timeout=30)
                cell_s[mode].append(cell())
                if mode == "without":
                    rs.execute(PUT_BACK, timeout=30)
    finally:
        workbench.stop()
    cells = {k: statistics.median(v) for k, v in cell_s.items()}
    run.rounds = [
        {"what": "per call (s)", **{k: [t for r in per_call for t in r[k]] for k in ("kept", "paused", "record")}},
        {"what": "trivial cell (s)", **cell_s},
    ]
    run.summary = {
        "all_reduce_us": {"kept": kept * 1e6, "paused": paused * 1e6},
        "record_us": record * 1e6,
        "trivial_cell_ms": {k: v * 1e3 for k, v in cells.items()},
    }
    print(
        f"the record: {record * 1e6:.2f} us a collective; one-float all_reduce on 2 ranks: {paused * 1e6:.1f} us "
        f"({kept * 1e6:.1f} us with the record); "
        f"trivial cell on 4 ranks: {cells['with'] * 1e3:.2f} ms with the record and log, "
        f"{cells['without'] * 1e3:.2f} ms without"
    )
    run.target("the record / a one-float all_reduce", record / paused, "<=", 0.05)
    run.target("trivial cell with / without the record and log", cells["with"] / cells["without"], "<=", 1.05)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
