"""Hours without growth: a long run whose memory, file descriptors and threads stay flat.

Bounds (docs/unattended.md; the method: docs/figures.md): each process's RSS grows at most
32 MiB, its descriptors by 4 and threads by 2; the store's rows, points and keys stay within
their limits; ``metrics()`` holds every step of every rank once. ``--short`` is what the suite
runs (``tests/ranks/test_soak.py``). Saved as ``benchmarks/results/soak-*.json``; exit 1 past a bound::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/soak_bench.py [--steps 3000] [--every 50] [--sample 100]"""

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


def soak(
    steps: int, every: int, sample_every: int, window: int, part_rows: int, folder: str
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
            print(
                f"step {at}: notebook rss {samples[-1]['notebook']['rss'] / MIB:.0f} MiB, ranks "
                + ", ".join(f"{r['rss'] / MIB:.0f}" for r in samples[-1]["ranks"])
                + f" MiB, store {samples[-1]['store']}",
                flush=True,
            )
        training.wait(timeout=600, rankset=rs)
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
    p.add_argument("--steps", type=int, default=3000)
    p.add_argument("--every", type=int, default=50, help="auto-save every N steps")
    p.add_argument("--sample", type=int, default=100, help="sample every N steps")
    p.add_argument("--baseline", type=int, default=None, help="growth is measured from this step (default steps/10)")
    p.add_argument("--window", type=int, default=1000, help="step rows the store keeps in memory")
    p.add_argument("--part-rows", type=int, default=10_000, help="tidy rows per Parquet part of the history")
    p.add_argument(
        "--short", action="store_true", help="300 steps sampled every 50, a 200-row window (the suite's version)"
    )
    a = p.parse_args(argv)
    if a.short:
        a.steps, a.sample, a.window, a.part_rows = 300, 50, 200, 2000
    if a.sample < 1 or a.steps < 2 * a.sample:
        p.error(f"--steps {a.steps} --sample {a.sample}: give at least two samples")
    baseline = a.baseline or max(a.sample, a.steps // 10)
    run = results.Run("soak", vars(a))  # a short run is judged too: its bounds are not speed figures
    folder = tempfile.mkdtemp(prefix="soak-")
    try:
        samples, end = soak(a.steps, a.every, a.sample, a.window, a.part_rows, folder)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
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
    run.target("store rows in memory (max)", max(s["rows"] for s in stores), "<=", end["window"] + 2)
    run.target(
        "store points per line (max mean)",
        max(s["points"] / max(1, s["lines"]) for s in stores),
        "<=",
        2 * end["max_points"],
    )
    run.target("store duplicate-check keys (max)", max(s["seen"] for s in stores), "<=", end["seen_limit"])
    run.target("ranks with every step once in metrics()", sum(end["steps_in_metrics"].values()), ">=", 2)
    return run.finish()


if __name__ == "__main__":
    sys.exit(main())
