"""Dispatch and start-up figures for the rank foundation.

Targets: a trivial ``%%distrain`` cell on 4 ranks at most 1.2x a raw ipyparallel
``apply_sync``; ``%distrain start -n 4`` to an initialised process group in at most 10 s on a
2-core CPU machine. Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/dispatch_bench.py``
(``--quick``: checks the script only; ``--pool``: every saved run). Results:
``benchmarks/results/dispatch-*.json``; the exit status is 1 when a target is missed."""

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


def median_ms(samples: list[float]) -> float:
    return statistics.median(samples) * 1000


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", type=int, default=4)
    parser.add_argument("--starts", type=int, default=3, help="start-up runs")
    parser.add_argument("--calls", type=int, default=200, help="dispatch calls per method")
    parser.add_argument("--quick", action="store_true", help="2 ranks, 1 start, 20 calls: checks the script only")
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    args = parser.parse_args(argv)
    if args.pool:
        return results.pool_report("dispatch")
    if args.quick:
        args.n, args.starts, args.calls = 2, 1, 20
    run = results.Run("dispatch", vars(args), quick=args.quick)

    from IPython.testing.globalipapp import get_ipython

    import workbench

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")

    starts = []
    for _ in range(args.starts):
        t0 = time.perf_counter()
        with redirect_stdout(io.StringIO()):
            ip.run_line_magic("distrain", f"start -n {args.n} --backend gloo")
        starts.append(time.perf_counter() - t0)
        ready = workbench.apply(lambda: __import__("torch.distributed").distributed.is_initialized())
        assert ready == [True] * args.n
        if len(starts) < args.starts:
            workbench.stop()

    rs = workbench.current()
    view = rs.view()
    noop = lambda: None  # noqa: E731

    def raw() -> None:
        view.apply_sync(noop)

    def magic() -> None:
        with redirect_stdout(io.StringIO()):
            ip.run_cell_magic("distrain", "", "pass")

    for fn in (raw, magic):  # warm up both paths
        for _ in range(10):
            fn()
    timings: dict[str, list[float]] = {"raw": [], "magic": []}
    for _ in range(args.calls):  # interleaved, so both see the same machine load
        for name, fn in (("raw", raw), ("magic", magic)):
            t0 = time.perf_counter()
            fn()
            timings[name].append(time.perf_counter() - t0)
    workbench.stop()

    raw_ms, magic_ms = median_ms(timings["raw"]), median_ms(timings["magic"])
    print(f"dispatch on {args.n} ranks, median of {args.calls} calls each:")
    print(f"  raw ipyparallel apply_sync : {raw_ms:7.2f} ms")
    print(f"  %%distrain trivial cell    : {magic_ms:7.2f} ms")
    print(f"  ratio %%distrain / raw     : {magic_ms / raw_ms:7.2f}x")
    print(f"start -n {args.n} to torch imported + process group ready, {args.starts} runs:")
    print(
        f"  median {statistics.median(starts):.2f} s  (runs: {', '.join(f'{s:.2f}' for s in starts)}; "
        f"cpu count {os.cpu_count()})"
    )
    run.rounds = [{"raw_s": r, "magic_s": m} for r, m in zip(timings["raw"], timings["magic"])]
    run.summary = {"raw_ms": raw_ms, "magic_ms": magic_ms, "start_s": starts}
    run.target("%%distrain / raw apply_sync", magic_ms / raw_ms, "<=", 1.2)
    run.target(f"start -n {args.n} (s)", statistics.median(starts), "<=", 10.0)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
