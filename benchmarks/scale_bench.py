"""The notebook side's cost against the rank count: real ranks here, SIMULATED ranks to 1024.

Targets (the method: docs/figures.md; docs/scale.md): with 1024 simulated ranks a dashboard
redraw <= 200 ms, the notebook keeps up with 10 step events/s a rank, one grouped ``where`` in
<= 2 s, a trivial cell's notebook CPU <= 5x that of 4 real ranks; 64 real ranks start in <= 12 s
and run a trivial cell in <= 100 ms; with stand-in engines the chosen tree depth's CPU per cell
<= 0.75x depth 1's, and 1024 register in <= 30 s. Run: ``OMP_NUM_THREADS=1 .venv/bin/python
benchmarks/scale_bench.py`` (``--quick``: checks the script only). Results: ``benchmarks/results/scale-*.json``."""

from __future__ import annotations

import argparse
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
sys.path.insert(0, str(ROOT / "tests"))
import results  # noqa: E402


def timed(fn, repeat: int) -> float:
    """Median seconds of ``fn()`` over ``repeat`` calls."""
    samples = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def rank_memory(rs) -> dict:
    """The ranks' memory: each one's own (PSS: pages shared with the process they were forked
    from, torch's among them, counted in part), median and sum, in MiB."""
    import psutil

    pss = []
    for proc in rs.procs:
        try:
            pss.append(psutil.Process(proc.pid).memory_full_info().pss / 2**20)
        except (psutil.Error, AttributeError):
            pass
    return {"rank_pss_mib_median": statistics.median(pss) if pss else None, "ranks_pss_mib_total": sum(pss)}


def real_ranks(n: int, calls: int) -> dict:
    from IPython.testing.globalipapp import get_ipython

    import workbench

    ip = get_ipython()
    with redirect_stdout(io.StringIO()):  # "already loaded" after the first size
        ip.run_line_magic("load_ext", "workbench")
    quiet = io.StringIO()
    t0 = time.perf_counter()
    with redirect_stdout(quiet), redirect_stderr(quiet):
        ip.run_line_magic("distrain", f"start -n {n} --backend gloo")
    start_s = time.perf_counter() - t0
    try:

        def cell(body: str):
            def run():
                with redirect_stdout(io.StringIO()):
                    ip.run_cell_magic("distrain", "", body)

            return run

        reduce = "import torch, torch.distributed as dist\nt = torch.ones(1)\ndist.all_reduce(t)"
        cell(reduce)()  # warm
        rs = workbench.current()
        fanned_from = rs.fanout_from
        row = {
            "ranks": n,
            "start_s": start_s,
            "load_avg_1": os.getloadavg()[0],
            "fanned": n >= fanned_from,
            **rank_memory(rs),
        }
        # the same trivial cell through a direct view and through the broadcast tree, interleaved
        # (same machine load); the notebook's CPU (all its threads) per cell beside the wall time
        paths = {"direct": 10**9, "fanned": 0}
        samples = {name: [] for name in paths}
        cpu = dict.fromkeys(paths, 0.0)
        trivial = cell("pass")
        for past in paths.values():  # warm both
            rs.fanout_from = past
            trivial()
        # in blocks, each block's first cell not counted: the direct view's status messages,
        # which arrive after its replies, are taken in while the next cell runs
        block = 4
        for _ in range(max(1, calls // block)):
            for name, past in paths.items():
                rs.fanout_from = past
                trivial()
                for _ in range(block):
                    c0, t0 = time.process_time(), time.perf_counter()
                    trivial()
                    samples[name].append(time.perf_counter() - t0)
                    cpu[name] += time.process_time() - c0
        rs.fanout_from = fanned_from
        default = "fanned" if row["fanned"] else "direct"
        row["trivial_cell_ms"] = statistics.median(samples[default]) * 1000
        for name in paths:
            row[f"trivial_cell_{name}_ms"] = statistics.median(samples[name]) * 1000
            row[f"notebook_cpu_{name}_ms"] = cpu[name] / len(samples[name]) * 1000
        row["all_reduce_cell_ms"] = timed(cell(reduce), calls) * 1000

        def status():
            with redirect_stdout(io.StringIO()):
                ip.run_line_magic("distrain", "status")

        def where():
            with redirect_stdout(io.StringIO()):
                ip.run_line_magic("distrain", "where --grouped")

        row["status_ms"] = timed(status, max(3, calls // 10)) * 1000
        row["where_ms"] = timed(where, 3) * 1000
    finally:
        with redirect_stdout(quiet), redirect_stderr(quiet):
            workbench.stop()
    return row


def simulated_cell(n: int, calls: int) -> dict:
    """A SIMULATION: a trivial ``%%distrain`` cell on ``n`` ranks through the real magic, rank set,
    client and fan-out, answered by a stand-in controller in another process (tests/sim_controller.py)
    as the broadcast tree answers; the notebook's CPU (all its threads) per cell and the wall time."""
    import tempfile

    import sim_controller
    from IPython.testing.globalipapp import get_ipython

    from workbench.notebook import session

    ip = get_ipython()
    with redirect_stdout(io.StringIO()):  # "already loaded" after the first size
        ip.run_line_magic("load_ext", "workbench")
    state = ROOT / ".state" / "bench"
    state.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=state) as folder, sim_controller.simulated_rankset(n, folder) as rs:
        with session.using(rs):

            def cell():
                with redirect_stdout(io.StringIO()):
                    ip.run_cell_magic("distrain", "", "pass")

            for _ in range(5):
                cell()
            walls, c0 = [], time.process_time()
            for _ in range(calls):
                t0 = time.perf_counter()
                cell()
                walls.append(time.perf_counter() - t0)
            cpu = (time.process_time() - c0) / calls
    return {"wall_ms": statistics.median(walls) * 1000, "notebook_cpu_ms": cpu * 1000}


def _cpu_s(procs) -> float:
    """User + system seconds of ``procs`` so far (those gone since count nothing)."""
    import psutil

    total = 0.0
    for proc in procs:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total


def tree(sizes: list[int], calls: int) -> list[dict]:
    """A SIMULATION: for each size ``n``, two sets of ``n`` stand-in engines (tests/sim_engines.py,
    one process each) registered with two REAL controllers, one with ipyparallel's default tree
    (depth 1), one with the depth the workbench chooses (``launchers.broadcast_depth``; one set
    where that is 1 too). A trivial ``%%distrain`` cell through the real magic, rank set and
    fan-out, on each set in turn (the machine's other load falls on both alike). Per cell: the
    wall, the notebook's CPU (this process) and the controller's (it and its schedulers, its
    heartbeat's CPU meanwhile measured apart); the stand-ins' own CPU apart too (the ranks' work)."""
    import contextlib
    import tempfile

    import psutil
    import sim_engines
    from IPython.testing.globalipapp import get_ipython

    from workbench.notebook import session
    from workbench.notebook.cluster import launchers

    ip = get_ipython()
    with redirect_stdout(io.StringIO()):
        ip.run_line_magic("load_ext", "workbench")
    state = ROOT / ".state" / "bench"
    state.mkdir(parents=True, exist_ok=True)

    def cell():
        with redirect_stdout(io.StringIO()):
            ip.run_cell_magic("distrain", "", "pass")

    rows = []
    for n in sizes:
        chosen = launchers.broadcast_depth(n)
        depths = [1] if chosen == 1 else [1, chosen]
        with contextlib.ExitStack() as stack:
            sets = []
            for depth in depths:
                folder = stack.enter_context(tempfile.TemporaryDirectory(dir=state))
                rs = stack.enter_context(sim_engines.standin_rankset(n, folder, depth=depth))
                sets.append((depth, rs, sim_engines.controller_tree(rs), [psutil.Process(rs.standins.pid)]))
            schedulers = {depth: sim_engines.broadcast_schedulers(rs) for depth, rs, _, _ in sets}
            for _, rs, _, _ in sets:
                with session.using(rs):
                    for _ in range(3):
                        cell()
            samples = {depth: {"wall": [], "nb": 0.0, "ctl": 0.0, "tree": 0.0, "st": 0.0} for depth in depths}
            quiet = {depth: [0.0, 0.0] for depth in depths}  # controller CPU, seconds with no cell
            for i in range(calls):
                # between rounds, no cell: what each controller spends on its own meanwhile (its
                # heartbeat to n ranks: every 3 s once all beat, every 100 ms while one is late)
                c0, t0 = [_cpu_s(tree) for _, _, tree, _ in sets], time.perf_counter()
                time.sleep(0.3)
                for (depth, _, tree, _), c in zip(sets, c0):
                    quiet[depth][0] += _cpu_s(tree) - c
                    quiet[depth][1] += time.perf_counter() - t0
                for depth, rs, tree, standins in sets if i % 2 == 0 else sets[::-1]:
                    got = samples[depth]
                    ctl0, st0, tree0 = _cpu_s(tree), _cpu_s(standins), _cpu_s(schedulers[depth])
                    with session.using(rs):
                        nb0, w0 = time.process_time(), time.perf_counter()
                        cell()
                        w1, nb1 = time.perf_counter(), time.process_time()
                    got["ctl"] += _cpu_s(tree) - ctl0
                    got["tree"] += _cpu_s(schedulers[depth]) - tree0
                    got["st"] += _cpu_s(standins) - st0
                    got["nb"] += nb1 - nb0
                    got["wall"].append(w1 - w0)
            for depth, rs, tree, standins in sets:
                got = samples[depth]
                idle_per_s = quiet[depth][0] / quiet[depth][1]
                wall = statistics.median(got["wall"])
                rows.append(
                    {
                        "ranks": n,
                        "simulated": True,
                        "standin_engines_real_controller": True,
                        "depth": depth,
                        "chosen_depth": chosen,
                        "leaves": 2**depth,
                        "controller_processes": len(tree),
                        "tree_schedulers": len(schedulers[depth]),
                        "controller_pss_mib": sum(p.memory_full_info().pss for p in tree if p.is_running()) / 2**20,
                        "standin_fds": standins[0].num_fds(),
                        "registration_s": rs.registration_s,
                        "cell_wall_ms": wall * 1000,
                        "notebook_cpu_ms": got["nb"] / calls * 1000,
                        "controller_cpu_ms": got["ctl"] / calls * 1000,
                        "tree_schedulers_cpu_ms": got["tree"] / calls * 1000,
                        # the controller's CPU without a cell, over as long as a cell took
                        "controller_idle_cpu_ms": idle_per_s * statistics.mean(got["wall"]) * 1000,
                        "notebook_controller_cpu_ms": (got["nb"] + got["ctl"]) / calls * 1000,
                        "standins_cpu_ms": got["st"] / calls * 1000,
                        "load_avg_1": os.getloadavg()[0],
                    }
                )
    return rows


def simulated(n: int, steps: int) -> dict:
    """A SIMULATION: ``n`` ranks' events through a real collector and store, no rank processes."""
    import sim_ranks

    from workbench.notebook.cluster.cell import show_grouped
    from workbench.notebook.commands.where import format_where
    from workbench.notebook.dashboard import bands, figures
    from workbench.notebook.stream import Collector, EventStore
    from workbench.shared import events

    # ingest: the store's own work per event, as the collector thread does it (decode + add)
    batches = []
    for step in range(steps):
        batch = []
        for r in range(n):
            m, c = sim_ranks.step_metrics(r, step)
            batch.append(events.step_event(run="ingest", rank=r, step=step, metrics=m, comm=c))
        batches.append(events.encode(batch))
    store = EventStore()
    t0 = time.perf_counter()
    for data in batches:
        store.add(events.decode(data))
    ingest_eps = steps * n / (time.perf_counter() - t0)

    # over the wire, paced at 10 steps/s a rank for 2 s: does the collector keep up?
    collector = Collector()
    pubs = sim_ranks.SimulatedPublishers(collector, n, slow_ranks={n // 3}, nan_ranks={n // 5})
    try:
        pubs.steps(steps)
        sim_ranks.wait_received(collector.store, steps * n, timeout=120)
        t0 = time.perf_counter()
        sent = pubs.run_for(2.0, rate=10.0)
        kept_up = sim_ranks.wait_received(collector.store, steps * n + sent, timeout=2.0)
        behind_s = time.perf_counter() - t0 - 2.0
        fig = figures.make_figure(widget=True, ranks=range(n))
        store = collector.store

        def redraw():
            figures.draw(fig, figures.lines_for(store, sim_ranks.RUN))

        redraw()  # the first adds the collective lines
        redraw_ms = timed(redraw, 5) * 1000
        traces = len(fig.data)
        ranks = store.ranks(sim_ranks.RUN)

        def heatmaps():  # the part of a redraw that makes the two rank x step heatmaps
            for metric in ("loss_local", "time_step_s"):
                bands.heatmap([store.arrays(sim_ranks.RUN, metric, r) for r in ranks], ranks)

        heatmaps_ms = timed(heatmaps, 5) * 1000
    finally:
        pubs.close()
        collector.close()

    stacks = sim_ranks.stacks(n, in_loader={n - 2, n - 1})
    where_ms = timed(lambda: format_where(stacks, group=True), 5) * 1000
    rest, displays, failures = sim_ranks.cell_replies(n, odd_ranks={5}, failing=set(range(n // 2, n)))
    sink = io.StringIO()

    def grouped_output():
        with redirect_stdout(sink), redirect_stderr(sink):
            show_grouped(list(range(n)), rest, displays, [None] * n, failures)

    output_ms = timed(grouped_output, 5) * 1000
    cell = simulated_cell(n, calls=30)
    return {
        "ranks": n,
        "simulated": True,
        "ingest_events_per_s": ingest_eps,
        "kept_up_10_steps_per_s": kept_up,
        "behind_after_2s_s": max(0.0, behind_s),
        "redraw_ms": redraw_ms,
        "redraw_heatmaps_ms": heatmaps_ms,
        "traces": traces,
        "where_grouped_ms": where_ms,
        "grouped_output_ms": output_ms,
        "trivial_cell_ms": cell["wall_ms"],
        "trivial_cell_notebook_cpu_ms": cell["notebook_cpu_ms"],
    }


def pictures(n: int, map_steps: int) -> dict:
    """A SIMULATION: the pictures past 16 ranks for ``n`` simulated ranks (data at the ranks' schemas)."""
    import json
    import tempfile

    import numpy as np
    import sim_ranks

    from workbench.notebook.dashboard import bands
    from workbench.notebook.dashboard.layout_figure import layout_figure
    from workbench.notebook.dashboard.timeline_figure import timeline_figure

    # rank x step heatmaps of a long run: every rank at every step (the store thins to ~2000)
    steps = np.arange(map_steps, dtype=float)
    rng = np.random.default_rng(0)
    lines = [(steps, 0.25 + 0.01 * rng.random(map_steps)) for _ in range(n)]
    heatmap_ms = timed(lambda: bands.heatmap(lines, list(range(n))), 5) * 1000
    cells = bands.heatmap(lines, list(range(n)))[2].size

    recs = sim_ranks.timeline_records(n, 3, slow=n // 3, fast=n // 7)
    timeline_ms = timed(lambda: timeline_figure(recs), 3) * 1000
    timeline_every_ms = timed(lambda: timeline_figure(recs, every_rank=True), 3) * 1000
    # what the browser is sent to draw: a few lanes, or two lanes a rank
    timeline_bytes = len(timeline_figure(recs).to_json())
    timeline_every_bytes = len(timeline_figure(recs, every_rank=True).to_json())
    lays = sim_ranks.layouts("fsdp", n, replicate=4 if n % 4 == 0 else 1)
    layout_ms = timed(lambda: layout_figure(lays), 3) * 1000

    # the Lab server's answer to one poll of the sidebar (every second while it is shown)
    from workbench.labserver.monitor import Monitor

    with tempfile.TemporaryDirectory() as tmp:
        os.environ["JUPYTER_RUNTIME_DIR"] = tmp
        sim = sim_ranks.SimulatedRankSet(n, tmp)
        sim.announce()
        monitor = Monitor()
        try:

            def poll():
                return json.dumps({"ranksets": [monitor.describe(e) for e in monitor.entries()]})

            poll()  # the first asks for the (absent) controller once
            sidebar_ms = timed(poll, 5) * 1000
            sidebar_bytes = len(poll())
        finally:
            monitor.close()
            sim.withdraw()
            del os.environ["JUPYTER_RUNTIME_DIR"]
    return {
        "ranks": n,
        "simulated": True,
        "heatmap_steps": map_steps,
        "heatmap_ms": heatmap_ms,
        "heatmap_cells": cells,
        "heatmap_unbinned_cells": n * map_steps,
        "timeline_extremes_ms": timeline_ms,
        "timeline_every_rank_ms": timeline_every_ms,
        "timeline_extremes_bytes": timeline_bytes,
        "timeline_every_rank_bytes": timeline_every_bytes,
        "layout_grouped_ms": layout_ms,
        "sidebar_poll_ms": sidebar_ms,
        "sidebar_poll_bytes": sidebar_bytes,
    }


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--real", type=int, nargs="*", default=[2, 4, 8, 16, 32, 64], help="real rank counts")
    parser.add_argument("--sim", type=int, nargs="*", default=[64, 256, 1024], help="simulated rank counts")
    parser.add_argument(
        "--tree",
        type=int,
        nargs="*",
        default=[],
        help="rank counts of stand-in engines against the real controller: its broadcast tree, depth 1 and chosen",
    )
    parser.add_argument("--tree-calls", type=int, default=20, help="cells per tree size and depth")
    parser.add_argument("--calls", type=int, default=30, help="cells per real size")
    parser.add_argument("--steps", type=int, default=20, help="steps of simulated history before measuring")
    parser.add_argument("--map-steps", type=int, default=2000, help="steps of the long run the heatmaps bin")
    parser.add_argument("--quick", action="store_true", help="2 real ranks, 64 simulated: checks the script only")
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    args = parser.parse_args(argv)
    if args.pool:
        return results.pool_report("scale")
    if args.quick:
        args.real, args.sim, args.calls, args.steps, args.map_steps = [2], [64], 5, 5, 200
        args.tree, args.tree_calls = [300] if args.tree else [], 5
    run = results.Run("scale", vars(args), quick=args.quick)
    real = [real_ranks(n, args.calls) for n in args.real]
    sim = [simulated(n, args.steps) for n in args.sim]
    pics = [pictures(n, args.map_steps) for n in args.sim]
    trees = tree(args.tree, args.tree_calls)
    print(
        "real ranks: start (s), trivial cell [direct / fanned] / all_reduce cell / status / where (ms, median),"
        " notebook CPU per trivial cell [direct / fanned] (ms), rank PSS (MiB, median)"
    )
    for r in real:
        print(
            f"  {r['ranks']:5d}  {r['start_s']:6.2f}  {r['trivial_cell_ms']:7.1f} [{r['trivial_cell_direct_ms']:.1f} / "
            f"{r['trivial_cell_fanned_ms']:.1f}]  {r['all_reduce_cell_ms']:7.1f}  {r['status_ms']:7.1f}"
            f"  {r['where_ms']:7.1f}  [{r['notebook_cpu_direct_ms']:.1f} / {r['notebook_cpu_fanned_ms']:.1f}]"
            f"  {r['rank_pss_mib_median'] or 0:.0f}  (load {r['load_avg_1']:.1f})"
        )
    print(
        "SIMULATED ranks: ingest (events/s), kept up at 10 steps/s, redraw (ms, traces), where / output (ms),"
        " trivial cell: notebook CPU / wall (ms)"
    )
    for s in sim:
        print(
            f"  {s['ranks']:5d}  {s['ingest_events_per_s']:9.0f}  {s['kept_up_10_steps_per_s']!s:5}"
            f"  {s['redraw_ms']:7.1f} ({s['traces']}; heatmaps {s['redraw_heatmaps_ms']:.1f})"
            f"  {s['where_grouped_ms']:7.1f}  {s['grouped_output_ms']:7.1f}"
            f"  {s['trivial_cell_notebook_cpu_ms']:6.2f} / {s['trivial_cell_ms']:6.1f}"
        )
    print(
        "SIMULATED ranks, pictures: heatmaps (ms, cells of the unbinned), timeline extremes / every rank"
        " (ms, kB), layout (ms), sidebar poll (ms, kB)"
    )
    for p in pics:
        print(
            f"  {p['ranks']:5d}  {p['heatmap_ms']:7.1f} ({p['heatmap_cells']} of {p['heatmap_unbinned_cells']})"
            f"  {p['timeline_extremes_ms']:7.1f} / {p['timeline_every_rank_ms']:7.1f}"
            f" ({p['timeline_extremes_bytes'] / 1e3:.0f} / {p['timeline_every_rank_bytes'] / 1e3:.0f})"
            f"  {p['layout_grouped_ms']:7.1f}  {p['sidebar_poll_ms']:7.1f} ({p['sidebar_poll_bytes'] / 1e3:.0f})"
        )
    if trees:
        print(
            "SIMULATED ranks (stand-in engines, REAL controller): depth (leaves), registration (s),"
            " trivial cell wall (ms, median), CPU per cell: notebook + controller (of which the tree's schedulers;"
            " its rate with no cell) = sum, stand-ins (ms)"
        )
    for t in trees:
        print(
            f"  {t['ranks']:5d}  {t['depth']} ({t['leaves']:2d})  {t['registration_s']:6.2f}  {t['cell_wall_ms']:7.1f}"
            f"  {t['notebook_cpu_ms']:6.1f} + {t['controller_cpu_ms']:6.1f} ({t['tree_schedulers_cpu_ms']:.1f};"
            f" {t['controller_idle_cpu_ms']:.1f})"
            f" = {t['notebook_controller_cpu_ms']:6.1f}  {t['standins_cpu_ms']:6.1f}"
            f"  [{t['controller_processes']} procs, {t['controller_pss_mib']:.0f} MiB; {t['standin_fds']} fds]"
            f"  (load {t['load_avg_1']:.1f})"
        )
    run.rounds = real + sim + pics + trees
    run.summary = {"real": real, "simulated": sim, "pictures": pics, "tree": trees}
    deep = [t for t in trees if t["depth"] != 1]
    if deep:  # the chosen depth against ipyparallel's default, same size, same run
        top = max(deep, key=lambda t: t["ranks"])
        one = next(t for t in trees if t["ranks"] == top["ranks"] and t["depth"] == 1)
        ratio = top["notebook_controller_cpu_ms"] / one["notebook_controller_cpu_ms"]
        run.summary["tree_cpu_ratio_chosen_to_depth_1"] = ratio
        run.target(
            f"notebook + controller CPU per cell, {top['ranks']} stand-ins, depth {top['depth']} / depth 1",
            ratio,
            "<=",
            0.75,
        )
        big = [t for t in trees if t["ranks"] >= 1024 and t["depth"] == t["chosen_depth"]]
        if big:
            run.target(f"registration of {big[0]['ranks']} stand-in engines (s)", big[0]["registration_s"], "<=", 30.0)
    for r in real:
        if r["ranks"] >= 64:
            run.target(f"start, {r['ranks']} real ranks (s)", r["start_s"], "<=", 12.0)
            run.target(f"trivial cell, {r['ranks']} real ranks (ms)", r["trivial_cell_ms"], "<=", 100.0)
    if not sim:
        return run.finish()
    top = max(sim, key=lambda s: s["ranks"])
    n = top["ranks"]
    run.target(f"dashboard redraw, {n} simulated ranks (ms)", top["redraw_ms"], "<=", 200.0)
    run.target(f"events/s taken in, {n} simulated ranks (need {n * 10})", top["ingest_events_per_s"], ">=", n * 10.0)
    run.target(f"where grouped, {n} simulated ranks (ms)", top["where_grouped_ms"], "<=", 2000.0)
    pic = max(pics, key=lambda p: p["ranks"])
    run.target(f"Lab sidebar poll answered, {n} simulated ranks (ms)", pic["sidebar_poll_ms"], "<=", 200.0)
    four = [r for r in real if r["ranks"] == 4]
    if four:  # the notebook's work for a trivial cell: n simulated ranks against 4 real ones (direct view)
        ratio = top["trivial_cell_notebook_cpu_ms"] / four[0]["notebook_cpu_direct_ms"]
        run.summary["notebook_cpu_ratio_sim_top_to_real_4"] = ratio
        run.target(f"trivial cell's notebook CPU, {n} simulated / 4 real ranks", ratio, "<=", 5.0)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
