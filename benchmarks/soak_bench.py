"""Hours without growth: a long run whose memory, file descriptors and threads stay flat.

Bounds (docs/unattended.md; the method: docs/figures.md): each process's RSS grows at most
32 MiB, its descriptors by 4 and threads by 2; the store's rows, points and keys stay within
their limits; ``metrics()`` holds every step of every rank once. The default run crosses the
store's window (40,000 steps of 2 ranks); ``--sim 64`` drives the notebook side with SIMULATED
ranks; ``--short`` is what the suite runs (``tests/ranks/test_soak.py``). Saved as
``benchmarks/results/soak-*.json``; exit 1 past a bound::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/soak_bench.py [--steps 40000] [--sim 64] [--tracemalloc 12]"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
sys.path.insert(0, ROOT)
import results  # noqa: E402

MIB = 2**20
RSS_GROWTH_MIB = 32
FD_GROWTH = 4
THREAD_GROWTH = 2
MAX_POINTS = 1000  # the store's points per plotted line before it thins (EventStore's max_points)


def proc_sample(proc) -> dict:
    with proc.oneshot():
        return {"rss": proc.memory_info().rss, "fds": proc.num_fds(), "threads": proc.num_threads()}


def sample(rs, store, step: int) -> dict:
    import psutil

    ranks = [proc_sample(psutil.Process(p.pid)) for p in rs.procs]
    parts = len(store.history.parts()) if store.history is not None else 0
    return {
        "step": step,
        "time": time.time(),
        "notebook": proc_sample(psutil.Process()),
        "ranks": ranks,
        "store": {**store.footprint(), "history_parts": parts},
    }


def notebook_sample(store, step: int) -> dict:
    import psutil

    parts = len(store.history.parts()) if store.history is not None else 0
    return {
        "step": step,
        "time": time.time(),
        "notebook": proc_sample(psutil.Process()),
        "ranks": [],
        "store": {**store.footprint(), "history_parts": parts},
    }


class Traced:
    """``tracemalloc`` snapshots at the baseline sample and at the end: what grew, by place."""

    def __init__(self, top: int):
        self.top = top
        self.base = None
        if top:
            import tracemalloc

            tracemalloc.start(8)

    def note(self, sample: dict, baseline: int) -> None:
        if self.top and self.base is None and sample["step"] >= baseline and sample["store"]["history_parts"] > 0:
            import tracemalloc

            self.base = (sample["step"], tracemalloc.take_snapshot())

    def report(self) -> list[dict]:
        if not self.top or self.base is None:
            return []
        import tracemalloc

        stats = tracemalloc.take_snapshot().compare_to(self.base[1], "traceback")[: self.top]
        return [{"kib": s.size_diff / 1024, "blocks": s.count_diff, "where": s.traceback.format()[-6:]} for s in stats]


def soak_simulated(
    n: int, steps: int, sample_every: int, window: int, part_rows: int, folder: str, traced: Traced, baseline: int
) -> tuple[list[dict], dict]:
    """A SIMULATION: ``n`` ranks' step events through a real collector into a real store with its
    history, the dashboard's figure redrawn twice a second meanwhile; the samples and the end state."""
    import threading

    sys.path.insert(0, os.path.join(ROOT, "tests"))
    import sim_ranks

    from workbench.notebook import metrics as metrics_mod
    from workbench.notebook.dashboard import figures
    from workbench.notebook.stream import Collector, EventStore
    from workbench.notebook.stream.history import History

    store = EventStore(window, history=History(os.path.join(folder, "metrics"), flush_every=part_rows))
    collector = Collector(store)
    pubs = sim_ranks.SimulatedPublishers(collector, n)
    fig = figures.make_figure(widget=True, ranks=range(n))
    stop = threading.Event()

    def redraw() -> None:  # as the live dashboard does while a run streams
        while not stop.wait(0.5):
            figures.draw(fig, figures.lines_for(store, sim_ranks.RUN))

    drawer = threading.Thread(target=redraw, daemon=True)
    drawer.start()
    samples = []
    try:
        for at in range(sample_every, steps + 1, sample_every):
            pubs.steps(sample_every)
            if not sim_ranks.wait_received(store, at * n, timeout=600):
                raise TimeoutError(f"{at * n} events not in the store within 600 s: {store.received}")
            samples.append(notebook_sample(store, at))
            traced.note(samples[-1], baseline)
            print(
                f"step {at}: notebook rss {samples[-1]['notebook']['rss'] / MIB:.0f} MiB, store {samples[-1]['store']}",
                flush=True,
            )
    finally:
        stop.set()
        drawer.join()
        pubs.close()
    grew = traced.report()
    frame = metrics_mod.metrics(sim_ranks.RUN, store=store)
    collector.close()
    loss = frame[frame["metric"] == "loss"]
    per_rank = loss.groupby("rank")["step"].apply(list)
    end = {
        "ranks_with_every_step": int(sum(per_rank.get(r, []) == list(range(steps)) for r in range(n))),
        "loss_rows": int(len(loss)),
        "spilled_rows": store.spilled,
        "history_bytes": store.history.bytes(),
        "max_points": store.max_points,
        "seen_limit": store._seen_limit,
        "window": store.window,
        "simulated_ranks": n,
        "tracemalloc_grew": grew,
    }
    return samples, end


def soak(
    steps: int, every: int, sample_every: int, window: int, part_rows: int, folder: str, traced, baseline: int
) -> tuple[list[dict], dict]:
    """Run the soak; the samples and what the end state says."""
    from workbench.notebook import api, stream, training
    from workbench.notebook import checkpoints as ck
    from workbench.notebook import metrics as metrics_mod
    from workbench.notebook.dashboard import dashboard

    stream.WINDOW_ROWS, stream.HISTORY_PART_ROWS = window, part_rows
    rs = api.start(2, backend="gloo", threads=1, sys_path=(ROOT,))
    try:
        ck.set_dir(folder)
        training.setup("ddp", rankset=rs)
        ck.autosave(every, keep=3, async_=True, root=folder, rankset=rs)
        dash = dashboard(rs, show=False)  # redraws in its thread as events arrive
        store = stream.attach(rs).store
        run = training.start(steps, rankset=rs)
        samples = []
        for at in range(sample_every, steps + 1, sample_every):
            if not store.wait(
                lambda s, at=at: len(s.last_steps(run)) == 2 and min(s.last_steps(run).values()) >= at, 900
            ):
                raise TimeoutError(f"no step {at} within 900 s: {training.states(run, rankset=rs)}")
            samples.append(sample(rs, store, at))
            traced.note(samples[-1], baseline)
            print(
                f"step {at}: notebook rss {samples[-1]['notebook']['rss'] / MIB:.0f} MiB, ranks "
                + ", ".join(f"{r['rss'] / MIB:.0f}" for r in samples[-1]["ranks"])
                + f" MiB, store {samples[-1]['store']}",
                flush=True,
            )
        training.wait(timeout=600, rankset=rs)
        grew = traced.report()
        dash.close()
        frame = metrics_mod.metrics(run, store=store)
        loss = frame[frame["metric"] == "loss"]
        end = {
            "steps_in_metrics": {
                int(r): loss[loss["rank"] == r]["step"].tolist() == list(range(1, steps + 1)) for r in (0, 1)
            },
            "loss_rows": int(len(loss)),
            "spilled_rows": store.spilled,
            "history_bytes": store.history.bytes() if store.history is not None else 0,
            "max_points": store.max_points,
            "seen_limit": store._seen_limit,
            "window": store.window,
            "started_pids": list(rs.started_pids),
            "tracemalloc_grew": grew,
        }
        return samples, end
    finally:
        api.stop()


def growth(samples: list[dict], baseline: int) -> dict:
    """From the first sample at ``baseline`` or later that follows the history's first write
    (pyarrow's writer and memory pool are allocated once, then) to the last sample."""
    i = next(i for i, s in enumerate(samples) if s["step"] >= baseline and s["store"]["history_parts"] > 0)
    base, last = samples[i], samples[-1]
    out = {
        "from_step": base["step"],
        "notebook_rss_before_first_write_mib": (
            (base["notebook"]["rss"] - samples[i - 1]["notebook"]["rss"]) / MIB if i else 0.0
        ),
        "to_step": last["step"],
        "notebook_rss_at_baseline_mib": base["notebook"]["rss"] / MIB,
        "notebook_rss_mib": (last["notebook"]["rss"] - base["notebook"]["rss"]) / MIB,
        "notebook_fds": last["notebook"]["fds"] - base["notebook"]["fds"],
        "notebook_threads": last["notebook"]["threads"] - base["notebook"]["threads"],
    }
    for i, (b, e) in enumerate(zip(base["ranks"], last["ranks"], strict=True)):
        out[f"rank{i}_rss_mib"] = (e["rss"] - b["rss"]) / MIB
        out[f"rank{i}_fds"] = e["fds"] - b["fds"]
        out[f"rank{i}_threads"] = e["threads"] - b["threads"]
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from workbench.notebook import stream

    p.add_argument("--steps", type=int, default=None, help="default 40,000 (--sim: 8,000)")
    p.add_argument("--every", type=int, default=50, help="auto-save every N steps")
    p.add_argument("--sample", type=int, default=None, help="sample every N steps (default steps/40)")
    p.add_argument(
        "--baseline", type=int, default=None, help="growth is measured from this step (default: 5%% past the window)"
    )
    p.add_argument("--window", type=int, default=stream.WINDOW_ROWS, help="step rows the store keeps in memory")
    p.add_argument(
        "--part-rows", type=int, default=stream.HISTORY_PART_ROWS, help="tidy rows per Parquet part of the history"
    )
    p.add_argument("--sim", type=int, default=0, metavar="N", help="N SIMULATED ranks, the notebook side alone")
    p.add_argument("--tracemalloc", type=int, default=0, metavar="N", help="report the N places that grew most")
    p.add_argument(
        "--short", action="store_true", help="300 steps sampled every 50, a 200-row window (the suite's version)"
    )
    a = p.parse_args(argv)
    if a.short:
        a.steps, a.sample, a.window, a.part_rows = 300, 50, 200, 2000
    a.steps = a.steps or (8000 if a.sim else 40_000)
    a.sample = a.sample or max(1, a.steps // 40)
    if a.sample < 1 or a.steps < 2 * a.sample:
        p.error(f"--steps {a.steps} --sample {a.sample}: give at least two samples")
    ranks = a.sim or 2
    # from a little past the point where the store's parts are at their bounds: the window full (its
    # first spill) and, in a run long enough, the plotted lines at 2 x max_points (a point a step
    # until then); at least a tenth of the run
    full = a.window / ranks
    if 2 * MAX_POINTS * 1.05 <= a.steps / 2:
        full = max(full, 2 * MAX_POINTS)
    baseline = a.baseline or max(a.sample, a.steps // 10, int(full * 1.05))
    if baseline >= a.steps:
        p.error(f"--steps {a.steps} does not cross the window ({a.window} rows of {ranks} ranks) by enough")
    run = results.Run("soak", {**vars(a), "baseline": baseline})  # a short run is judged too: no speed figures
    traced = Traced(a.tracemalloc)
    folder = tempfile.mkdtemp(prefix="soak-")
    try:
        if a.sim:
            samples, end = soak_simulated(a.sim, a.steps, a.sample, a.window, a.part_rows, folder, traced, baseline)
        else:
            samples, end = soak(a.steps, a.every, a.sample, a.window, a.part_rows, folder, traced, baseline)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    for item in end["tracemalloc_grew"]:
        print(f"grew {item['kib']:9.1f} KiB in {item['blocks']:+d} blocks at", *item["where"], sep="\n    ")
    g = growth(samples, baseline)
    run.rounds = samples
    run.summary = {"growth": g, "end": end}
    for key, value in g.items():
        if key.startswith("notebook_rss_before"):
            continue  # the one-time step, reported
        if key.endswith("_rss_mib"):
            run.target(f"{key} growth", value, "<=", RSS_GROWTH_MIB)
        elif key.endswith("_fds"):
            run.target(f"{key} growth", value, "<=", FD_GROWTH)
        elif key.endswith("_threads"):
            run.target(f"{key} growth", value, "<=", THREAD_GROWTH)
    stores = [s["store"] for s in samples]
    run.target("store rows in memory (max)", max(s["rows"] for s in stores), "<=", end["window"] + ranks)
    run.target(
        "store points per line (max mean)",
        max(s["points"] / max(1, s["lines"]) for s in stores),
        "<=",
        2 * end["max_points"],
    )
    run.target("store duplicate-check keys (max)", max(s["seen"] for s in stores), "<=", end["seen_limit"])
    if a.sim:
        run.target("SIMULATED ranks with every step once in metrics()", end["ranks_with_every_step"], ">=", a.sim)
    else:
        run.target("ranks with every step once in metrics()", sum(end["steps_in_metrics"].values()), ">=", 2)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
