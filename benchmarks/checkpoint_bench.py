"""How long a checkpoint blocks training: async save vs sync save, what checksums add, restore time.

Targets: an async save blocks at most 1/4 of a sync save, checksums included; steps/s while
async saves are written >= 0.9 of steps/s without (the method: docs/figures.md). Results:
``benchmarks/results/checkpoint-*.json`` (``--pool``: every saved run; ``--quick``: checks the
script only). Usage::

    OMP_NUM_THREADS=1 python benchmarks/checkpoint_bench.py [--runs N] [--models tiny,m100] [--ranks 2,4] [--steps N --every 10 --train-rounds N]"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results  # noqa: E402

from workbench.notebook import checkpoints as ck  # noqa: E402
from workbench.notebook.cluster import RankSet  # noqa: E402

BUILD = """
import torch
from workbench.models import GPT, GPTConfig, batch_at, SyntheticDataset
from workbench.strategies import prepare
from workbench.engine import checkpoint_hooks as ch
torch.manual_seed(0)
_cfg = {"tiny": GPTConfig.tiny(), "m100": GPTConfig.m100(max_seq_len=64)}[{model!r}]
_prep = prepare(GPT(_cfg), lambda ps: torch.optim.AdamW(ps, lr=1e-4), "fsdp2")
_state = ch.track(_prep)
_x = torch.randint(0, 256, (2, 16))
_prep.train_step((_x, _x))
_state.step = 1
_nparams = sum(p.numel() for p in _prep.unwrap().parameters())


def _writer_ticks():
    # CPU clock ticks (utime + stime) of this process's checkpoint writer threads, from /proc
    import threading
    total = 0
    for th in threading.enumerate():
        if th.name.startswith("workbench-ckpt") and th.native_id:
            try:
                with open(f"/proc/self/task/{th.native_id}/stat") as fh:
                    f = fh.read().rsplit(")", 1)[1].split()
                total += int(f[11]) + int(f[12])
            except OSError:
                pass
    return total


def _schedstat():
    # this thread's (ns on a CPU, ns waiting in the run queue); 0s where /proc has no schedstat
    import threading
    try:
        with open(f"/proc/self/task/{threading.get_native_id()}/schedstat") as fh:
            return tuple(int(v) for v in fh.read().split()[:2])
    except OSError:
        return 0, 0


def _timed_steps(n, root, every):
    # n training steps, with an async auto-save every `every` steps (0: none): wall seconds, and CPU
    # seconds of the training thread in train_step and in step_done (the saves' blocking part) and of
    # the background writer (the load of other processes inflates these far less than wall time);
    # and the training thread's time in train_step neither on a CPU nor waiting for one ("sleep": its
    # collectives' waits, and the GIL's while another thread of the rank holds it)
    import os, time
    from workbench.engine.checkpoint import save as _save
    ch.set_autosave(root if every else None, every or None, keep=2, async_=True)
    tick = os.sysconf("SC_CLK_TCK")
    train_cpu = hook_cpu = hook_wall = sleep = step_wall = writing_wall = 0.0
    writing = 0  # steps that started while a background write was in flight
    try:
        w0 = _writer_ticks()
        t0 = time.perf_counter()
        for _ in range(n):
            fut = _save.pending()
            busy = fut is not None and not fut.done()
            s0, c0, a0 = _schedstat(), time.thread_time(), time.perf_counter()
            loss = _prep.train_step((_x, _x))
            c1, h0 = time.thread_time(), time.perf_counter()
            step_wall += h0 - a0
            if busy:
                writing += 1
                writing_wall += h0 - a0
            s1 = _schedstat()
            sleep += (h0 - a0) - ((s1[0] - s0[0]) + (s1[1] - s0[1])) / 1e9
            ch.step_done(loss)
            hook_cpu += time.thread_time() - c1
            hook_wall += time.perf_counter() - h0
            train_cpu += c1 - c0
        seconds = time.perf_counter() - t0
        _save.wait()
        return {"wall": seconds, "train_cpu": train_cpu, "hook_cpu": hook_cpu, "hook_wall": hook_wall,
                "step_wall": step_wall, "writing": writing, "writing_wall": writing_wall,
                "writer_cpu": (_writer_ticks() - w0) / tick, "train_sleep": sleep}
    finally:
        ch.set_autosave(None, None)
"""


def _together(root, tag, async_):
    """One save on this rank, every rank starting it at once as after a training step (a request
    from the notebook reaches the ranks milliseconds apart, and the first would count its wait for
    the last as save time); returns this rank's blocked seconds (the whole save when sync)."""
    import torch.distributed as dist

    from workbench.engine import checkpoint_hooks as ch

    dist.barrier()
    return ch.rank_save(root, tag=tag, async_=async_)["blocked_s"]


def _set_checksum(algo):
    from workbench.engine.checkpoint import save

    save.CHECKSUM = algo
    return algo


# Steps timed with and without auto-saves, and rounds of that, per model unless --steps/--train-rounds
# say: a ~100M-model step is thousands of times the tiny model's work on a CPU rank; 30 steps with a
# save every 10 still overlap two whole background saves with training.
TRAIN_STEPS = {"tiny": 40, "m100": 30}
TRAIN_ROUNDS = {"tiny": 3, "m100": 2}
# Saves of each kind per model unless --runs says: a tiny model's save is short and moves a lot
# from one to the next on a shared 2-core machine, so its median takes more of them
SAVE_RUNS = {"tiny": 9, "m100": 3}


def bench(model: str, n: int, runs: int, steps: int = 40, every: int = 10, train_rounds: int | None = None) -> dict:
    from workbench.shared.checkpoint import integrity

    rs = RankSet.start(n=n, backend="gloo", threads=1)
    root = tempfile.mkdtemp(prefix=f"ckbench-{model}-{n}-")
    try:
        rs.execute(BUILD.replace("{model!r}", repr(model)), timeout=600)
        nparams = rs.pull("_nparams")[0]
        out = {"model": model, "params": nparams, "ranks": n}
        m: dict = {}
        for i in range(runs):
            modes = (("checksum", integrity.ALGO), ("sizes", None))
            for mode, algo in modes if i % 2 == 0 else modes[::-1]:  # alternate which goes first
                rs.apply(_set_checksum, algo)
                m.setdefault(f"{mode}_sync", []).append(max(rs.apply(_together, root, f"sync{i}", False)))
                out["size_mb"] = float(ck.list(root).set_index("name").loc[f"sync{i}", "size_mb"])
                t0 = time.perf_counter()
                m.setdefault(f"{mode}_async_blocked", []).append(max(rs.apply(_together, root, f"async{i}", True)))
                ck.wait(rankset=rs)
                m.setdefault(f"{mode}_async_total", []).append(time.perf_counter() - t0)
                if mode == "checksum":
                    res = rs.apply(_load_latest, root)
                    m.setdefault("restore", []).append(max(r["load_s"] for r in res))
                    m.setdefault("verify", []).append(max(r["verify_s"] for r in res))
                    out["staging_mb"] = max(r["staging_bytes"] for r in res) / 2**20
                    if i == 0:
                        out["largest_file"] = _largest(os.path.join(root, f"async{i}"))
                for name in (f"sync{i}", f"async{i}"):
                    shutil.rmtree(os.path.join(root, name), ignore_errors=True)
        auto_root = os.path.join(root, "auto")
        for i in range(runs if train_rounds is None else train_rounds):
            for mode, k in (("saving", every), ("plain", 0)) if i % 2 == 0 else (("plain", 0), ("saving", every)):
                rs.execute(f"_ts = _timed_steps({steps}, {auto_root!r}, {k})", timeout=1800)
                ts = rs.pull("_ts")
                m.setdefault(f"train_{mode}", []).append(max(t["wall"] for t in ts))
                # a step's time on the slowest rank: over the steps that overlapped a write (saving), or all
                if k:
                    m.setdefault("steps_written_over", []).append(min(t["writing"] for t in ts))
                    step_s = max(t["writing_wall"] / max(t["writing"], 1) for t in ts)
                else:
                    step_s = max(t["step_wall"] / steps for t in ts)
                m.setdefault(f"step_{mode}", []).append(step_s)
                # per rank, per step (CPU: mean over ranks)
                m.setdefault(f"train_cpu_ms_{mode}", []).append(
                    1e3 * statistics.mean(t["train_cpu"] for t in ts) / steps
                )
                m.setdefault(f"train_sleep_ms_{mode}", []).append(
                    1e3 * statistics.mean(t["train_sleep"] for t in ts) / steps
                )
                if k:
                    saves = steps // k
                    m.setdefault("autosave_blocked_ms", []).append(1e3 * max(t["hook_wall"] for t in ts) / saves)
                    m.setdefault("autosave_blocked_cpu_ms", []).append(
                        1e3 * statistics.mean(t["hook_cpu"] for t in ts) / saves
                    )
                    m.setdefault("autosave_writer_cpu_ms", []).append(
                        1e3 * statistics.mean(t["writer_cpu"] for t in ts) / saves
                    )
            shutil.rmtree(auto_root, ignore_errors=True)
        med = statistics.median
        for k, v in m.items():
            unit = "" if k.endswith("_ms") or "_ms_" in k else "_s"
            out[f"{k}{unit}"] = med(v)
            out[f"{k}_all{unit}"] = v
        out["train_steps"], out["train_save_every"], out["train_rounds"] = steps, every, len(m["train_plain"])
        out["steps_per_s_saving"] = steps / out["train_saving_s"]
        out["steps_per_s_plain"] = steps / out["train_plain_s"]
        # per round (same round, either order), then the median of the rounds
        out["run_steps_per_s_ratio_all"] = [p / s for p, s in zip(m["train_plain"], m["train_saving"])]
        out["run_steps_per_s_ratio"] = med(out["run_steps_per_s_ratio_all"])
        # the target's figure: steps/s of the steps that ran while a write was in flight, against
        # steps with no checkpointing (the blocking part is beside it, not in it)
        out["steps_per_s_writing"] = 1 / out["step_saving_s"]
        out["steps_written_over"] = out.pop("steps_written_over_s")
        out["steps_written_over_all"] = out.pop("steps_written_over_all_s")
        out["steps_per_s_ratio_all"] = [p / s for p, s in zip(m["step_plain"], m["step_saving"])]
        out["steps_per_s_ratio"] = med(out["steps_per_s_ratio_all"])
        out["async_over_sync"] = out["checksum_async_blocked_s"] / out["checksum_sync_s"]
        out["async_over_sync_sizes_only"] = out["sizes_async_blocked_s"] / out["sizes_sync_s"]
        out["checksum_added_sync_s"] = out["checksum_sync_s"] - out["sizes_sync_s"]
        out["checksum_added_async_blocked_s"] = out["checksum_async_blocked_s"] - out["sizes_async_blocked_s"]
        return out
    finally:
        rs.stop()
        shutil.rmtree(root, ignore_errors=True)


def _largest(folder: str) -> str:
    files = [os.path.join(folder, n) for n in os.listdir(folder)]
    big = max(files, key=os.path.getsize)
    keep = tempfile.mktemp(prefix="ckbench-file-")
    shutil.copyfile(big, keep)
    return keep


def checksum_speed(path: str, runs: int) -> dict:
    """GB/s of each checksum over one checkpoint file (read from the page cache), one core."""
    import zlib

    import xxhash

    def crc(b):
        return zlib.crc32(b)

    with open(path, "rb") as fh:
        data = fh.read()
    algos = {"crc32": crc, "sha256": lambda b: hashlib.sha256(b).digest(), "xxh3_64": xxhash.xxh3_64_digest}
    out = {"bytes": len(data)}
    for name, fn in algos.items():
        times = []
        for _ in range(max(3, runs)):
            t0 = time.perf_counter()
            fn(data)
            times.append(time.perf_counter() - t0)
        out[name + "_gb_s"] = len(data) / statistics.median(times) / 1e9
    return out


def _load_latest(root):
    from workbench.engine import checkpoint_hooks as ch
    from workbench.shared.checkpoint import catalog

    folder, _ = catalog.resolve(root, "latest")
    return ch.rank_load(folder)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=None, help=f"saves of each kind (default per model: {SAVE_RUNS})")
    p.add_argument("--models", default="tiny,m100")
    p.add_argument("--ranks", default="2,4")
    p.add_argument(
        "--steps",
        type=int,
        default=None,
        help=f"training steps timed with and without async auto-saves (default per model: {TRAIN_STEPS})",
    )
    p.add_argument(
        "--train-rounds",
        type=int,
        default=None,
        help=f"rounds of those (default per model: {TRAIN_ROUNDS})",
    )
    p.add_argument("--every", type=int, default=10, help="auto-save every N of those steps")
    p.add_argument("--quick", action="store_true", help="the tiny model on 2 ranks, 1 run: checks the script only")
    p.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    a = p.parse_args(argv)
    models = a.models.split(",")
    unknown = [x for x in models if x not in TRAIN_STEPS]
    if unknown:
        p.error(f"--models {a.models}: unknown {', '.join(unknown)}; the models are {', '.join(TRAIN_STEPS)}")
    if a.every < 1 or min(a.steps or TRAIN_STEPS[x] for x in models) < a.every:
        p.error(f"--every {a.every} --steps {a.steps}: give --every >= 1 and --steps >= --every (at least one save)")
    if a.train_rounds is not None and a.train_rounds < 1:
        p.error(f"--train-rounds {a.train_rounds}: give at least 1")
    if a.pool:
        return results.pool_report("checkpoint")
    if a.quick:
        a.runs, a.models, a.ranks = 1, "tiny", "2"
    run = results.Run("checkpoint", vars(a), quick=a.quick)
    rows = []
    speed = None
    for model in a.models.split(","):
        for n in (int(x) for x in a.ranks.split(",")):
            steps = a.steps or TRAIN_STEPS[model]
            runs = a.runs or SAVE_RUNS[model]
            rounds = a.train_rounds or min(runs, TRAIN_ROUNDS[model])
            rows.append(bench(model, n, runs, steps, a.every, rounds))
            big = rows[-1].pop("largest_file", None)
            if big:
                sp = checksum_speed(big, runs)
                os.remove(big)
                if speed is None or sp["bytes"] > speed["bytes"]:
                    speed = sp
            print(f"# done {model} on {n} ranks", file=sys.stderr, flush=True)
    print(
        f"checksums over a {speed['bytes'] / 2**20:.1f} MiB checkpoint file, one core: "
        + ", ".join(f"{k[:-5]} {v:.2f} GB/s" for k, v in speed.items() if k.endswith("_gb_s"))
    )
    hdr = (
        f"{'model':<6} {'params':>11} {'ranks':>5} {'ckpt MB':>8} {'sync s':>8} {'(no sum)':>8} "
        f"{'async blocks s':>15} {'(no sum)':>8} {'async/sync':>10} {'async write s':>14} {'restore s':>10} "
        f"{'verify s':>9} {'staging MB':>11}"
    )
    print(
        f"checkpoint benchmark: FSDP2 + AdamW, gloo CPU ranks, median of {a.runs or SAVE_RUNS} runs; "
        "'no sum': the same save recording sizes only"
    )
    print(hdr)
    print("-" * len(hdr))
    for r in rows:
        print(
            f"{r['model']:<6} {r['params']:>11,} {r['ranks']:>5} {r['size_mb']:>8.1f} {r['checksum_sync_s']:>8.3f} "
            f"{r['sizes_sync_s']:>8.3f} {r['checksum_async_blocked_s']:>15.3f} {r['sizes_async_blocked_s']:>8.3f} "
            f"{r['async_over_sync']:>10.2f} {r['checksum_async_total_s']:>14.3f} {r['restore_s']:>10.3f} "
            f"{r['verify_s']:>9.3f} {r['staging_mb']:>11.1f}"
        )
        run.target(
            f"{r['model']} x{r['ranks']} async blocked / sync save (checksums on)", r["async_over_sync"], "<=", 0.25
        )
    print(
        f"training while async saves are written: an auto-save every {a.every} steps, against the same steps "
        "without checkpoints (median of the rounds' ratios); CPU ms per rank (mean over ranks), which the load "
        "of other processes inflates far less than wall time: the training thread's per step in train_step "
        "with and without saves, and per auto-save its blocking part (step_done) and the writer thread's"
    )
    for r in rows:
        print(
            f"{r['model']:<6} x{r['ranks']}: {r['train_steps']} steps x {r['train_rounds']} rounds: "
            f"{r['steps_per_s_writing']:.2f} steps/s while a write is in flight "
            f"({r['steps_written_over']:.0f} steps a round), {1 / r['step_plain_s']:.2f} without: ratio "
            f"{r['steps_per_s_ratio']:.3f} (rounds {', '.join(f'{x:.3f}' for x in r['steps_per_s_ratio_all'])}); "
            f"whole run, the saves' blocking parts included: {r['steps_per_s_saving']:.2f} steps/s saving, "
            f"{r['steps_per_s_plain']:.2f} without, ratio {r['run_steps_per_s_ratio']:.3f}; "
            f"train CPU/step {r['train_cpu_ms_saving']:.1f} ms saving, {r['train_cpu_ms_plain']:.1f} without; "
            f"train sleep/step {r['train_sleep_ms_saving']:.1f} ms saving, {r['train_sleep_ms_plain']:.1f} without; "
            f"per save: blocked {r['autosave_blocked_ms']:.1f} ms ({r['autosave_blocked_cpu_ms']:.1f} ms CPU), "
            f"writer {r['autosave_writer_cpu_ms']:.0f} ms CPU"
        )
        run.target(
            f"{r['model']} x{r['ranks']} steps/s while async saves are written / without",
            r["steps_per_s_ratio"],
            ">=",
            0.9,
        )
    run.rounds, run.summary = rows, {"checksum_speed": speed}
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
