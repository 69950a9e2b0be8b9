"""Strategy benchmark: the workbench's live ranks against a plain ``torchrun`` script.

Target: step time on the workbench's ranks / the same layout written by hand
(``benchmarks/handwritten.py``) under ``torchrun`` at most 1.03 for every strategy on 2 and 4
CPU ranks, with a CPU census of every helper thread per round (the method: docs/figures.md).
Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/strategy_bench.py`` (``--quick``: checks
the script only; ``--pool``: every saved run; ``--strategies ddp,pp``, ``--worlds 4``: a
subset). Results: ``benchmarks/results/strategy-*.json``; exit status 1 on a miss."""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import results  # noqa: E402

STRATEGIES = {2: ["ddp", "fsdp2", "zero", "tp", "pp"], 4: ["ddp", "fsdp2", "zero", "tp", "fsdp2_tp", "pp"]}
SPECS = {
    "ddp": "ddp",
    "fsdp2": "fsdp2",
    "zero": "zero zero_stage=2",
    "tp": "tp",
    "fsdp2_tp": "fsdp2_tp tp=2",
    "pp": "pp pp_schedule=1f1b pp_microbatches=4",  # as by hand (the workbench's default is 2 x stages)
}


def measure(
    spec: str, steps: int, warmup: int, dim: int, handwritten: str | None = None, watch: dict | None = None
) -> dict:
    """On one rank: lay the model out with ``spec`` (or by hand: ``handwritten`` names the
    layout in ``benchmarks/handwritten.py``) and time ``steps`` training steps.

    Over the timed steps it also takes a CPU census (``cpu_census``) of this rank's
    threads and, on rank 0, of the processes in ``watch`` (role -> pid: the controller,
    the ranks' parent, torchrun's agent, the driver) and their children.
    Self-contained (imports inside) because it is shipped to the ranks by value.
    """
    import ctypes
    import gc
    import os
    import resource
    import statistics
    import threading
    import time

    import cpu_census
    import psutil
    import torch
    import torch.distributed as dist

    from workbench.models import GPT, GPTConfig, TextDataset, batch_at
    from workbench.strategies import prepare

    torch.manual_seed(0)
    cfg = GPTConfig.tiny(dim=dim, n_layers=4, n_heads=4, n_kv_heads=4, ffn_dim=4 * dim, max_seq_len=64)
    model = GPT(cfg)
    if handwritten:
        import handwritten as hw

        train_step, close = hw.build(handwritten, model, 1e-3), None
        dp_rank, dp_size = hw.data_rank(handwritten)
    else:
        prepared = prepare(model, lambda params: torch.optim.AdamW(params, lr=1e-3), spec)
        train_step, close = prepared.train_step, getattr(prepared, "close", None)
        dp_rank, dp_size = prepared.dp_rank, prepared.dp_size
    data = TextDataset(seq_len=64)
    roles = {"rank": os.getpid()}
    if dist.get_rank() == 0:
        for role, pid in (watch or {}).items():
            roles[role] = pid
    times = []
    for step in range(warmup + steps):
        batch = batch_at(data, 8, step, dp_rank=dp_rank, dp_size=dp_size)
        dist.barrier()
        if step == warmup:
            before, w0 = cpu_census.snapshot(roles), time.perf_counter()
            faults0 = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
        t0 = time.perf_counter()
        train_step(batch)
        times.append(time.perf_counter() - t0)
    faults = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - faults0
    dist.barrier()
    after, window = cpu_census.snapshot(roles), time.perf_counter() - w0
    census = cpu_census.delta(before, after, cpu_census.python_thread_names())
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except OSError:
        pass
    uss = psutil.Process().memory_full_info().uss
    if close:
        close()
    return {
        "step_s": statistics.median(times[warmup:]),
        "uss": uss,
        "rank": dist.get_rank(),
        "train_tid": threading.get_native_id(),
        "window_s": window,
        "census": census,
        "faults": faults,
    }


def worker_main(args) -> None:
    """Entry point under torchrun: one rank of the plain-script side."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    # the worker's parent is torchrun's agent (it started the workers and watches them)
    watch = {"torchrun agent": os.getppid(), "driver": args.driver_pid}
    result = measure(
        SPECS[args.worker],
        args.steps,
        args.warmup,
        args.dim,
        handwritten=args.worker if args.handwritten else None,
        watch=watch,
    )
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, result)
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps(gathered), flush=True)
    dist.destroy_process_group()


def torchrun(kind: str, n: int, args, handwritten: bool = False) -> list[dict]:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={n}",
        str(pathlib.Path(__file__)),
        "--worker",
        kind,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
        "--dim",
        str(args.dim),
        "--driver-pid",
        str(os.getpid()),
        *(["--handwritten"] if handwritten else []),
    ]
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)
    for line in out.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"torchrun {kind} x{n} failed:\n{out.stderr[-3000:]}")


SIDES = ("handwritten", "workbench", "torchrun")


def ratio_interval(wb: list[float], hand: list[float], resamples: int = 2000) -> tuple[float, float]:
    """90% bootstrap interval of median(wb) / median(hand), resampling each side's rounds
    (each round a fresh rank set and a fresh torchrun job)."""
    import random

    rng = random.Random(0)
    boot = sorted(
        statistics.median(rng.choices(wb, k=len(wb))) / statistics.median(rng.choices(hand, k=len(hand)))
        for _ in range(resamples)
    )
    return boot[int(0.05 * resamples)], boot[int(0.95 * resamples) - 1]


def pooled_rows(folder=None) -> int:
    """Every row's ratio over the rounds of every saved run that started a fresh rank set a
    round (their rounds carry ``round``), with its 90% interval: more rounds, a narrower one."""
    pooled: dict = {}
    runs = 0
    for doc in results.saved("strategy", folder):
        rounds = [r for r in doc["rounds"] if "round" in r]
        runs += bool(rounds)
        for r in rounds:
            pooled.setdefault((r["world"], r["strategy"]), {}).setdefault(r["side"], []).append(r["step_s"])
    if not pooled:
        print("no saved run with a fresh rank set a round")
        return 0
    print(f"pooled over the {runs} runs with a fresh rank set a round:")
    for (n, kind), sides in sorted(pooled.items()):
        wb, hand = sides.get("workbench", []), sides.get("handwritten", [])
        if wb and hand:
            lo, hi = ratio_interval(wb, hand)
            value = statistics.median(wb) / statistics.median(hand)
            print(f"  {kind:>9} x{n}: {value:.3f} (90% interval {lo:.3f}-{hi:.3f}), {len(wb)} / {len(hand)} rounds")
    return 0


def cpu_use(got: list[dict], steps: int) -> dict:
    """One round's census: CPU ms per step of the training threads (summed over ranks), the
    time they waited for a CPU, their minor page faults, and of everything else by ``role / thread`` (with wake-ups
    per second): rank helper threads, gloo's and ZMQ's threads, the processes beside."""
    window = max(r["window_s"] for r in got)
    train = wait = 0.0
    faults = sum(r.get("faults", 0) for r in got)
    threads: dict[str, list[float]] = {}
    for r in got:
        for row in r["census"]:
            if row["role"] == "rank" and row["tid"] == r["train_tid"]:
                train += row["cpu_ms"]
                wait += row["wait_ms"]
                continue
            key = f"{row['role'].split(':')[0]} / {row['thread']}"
            acc = threads.setdefault(key, [0.0, 0.0])
            acc[0] += row["cpu_ms"] / steps
            acc[1] += row["wakeups"] / window
    return {
        "training_ms_per_step": train / steps,
        "training_wait_ms_per_step": wait / steps,
        "training_page_faults_per_step": faults / steps,
        "outside_ms_per_step": sum(ms for ms, _ in threads.values()),
        "threads": {k: [round(ms, 4), round(w, 2)] for k, (ms, w) in sorted(threads.items())},
    }


def census_table(census: dict) -> list[dict]:
    """Per world and side, each thread's mean ms/step and wake-ups/s over the rounds."""
    out = []
    for (n, side), threads in sorted(census.items()):
        for key, (ms, wake, rounds) in threads.items():
            out.append(
                {"world": n, "side": side, "thread": key, "ms_per_step": ms / rounds, "wakeups_per_s": wake / rounds}
            )
    return out


def census_lines(threads: list[dict], top: int = 12) -> list[str]:
    lines = []
    for n, side in sorted({(t["world"], t["side"]) for t in threads}):
        these = sorted((t for t in threads if (t["world"], t["side"]) == (n, side)), key=lambda t: -t["ms_per_step"])
        total = sum(t["ms_per_step"] for t in these)
        lines.append(f"  {side} x{n}: {total:.2f} ms/step in all")
        for t in these[:top]:
            lines.append(f"    {t['thread']:<48} {t['ms_per_step']:8.3f} ms/step {t['wakeups_per_s']:8.1f} /s")
    return lines


def workbench_roles(rs) -> dict[str, int]:
    """role -> pid of the processes beside the workbench's ranks: this driver (the notebook),
    the process that forked the ranks, the controller and each process it started (the one
    bound to the heartbeat's ping port named ``heartmonitor``)."""
    import cpu_census
    import psutil

    roles = {"driver": os.getpid()}
    if getattr(rs, "forked", None) is not None:
        roles["preload parent"] = rs.forked.pid
    ctl = rs.cluster.controller
    root = getattr(ctl, "pid", None) or ctl.process.pid
    roles["controller"] = root
    security = pathlib.Path(rs.cluster.profile_dir) / "security"
    info = json.loads((security / f"ipcontroller-{rs.cluster.cluster_id}-engine.json").read_text())
    for pid in cpu_census.children(root):
        try:
            ports = {c.laddr.port for c in psutil.Process(pid).net_connections("tcp") if c.status == "LISTEN"}
        except psutil.Error:
            continue
        roles["heartmonitor" if info.get("hb_ping") in ports else f"scheduler:{pid}"] = pid
    return roles


def workbench_run(rs, kind: str, args, roles: dict[str, int]) -> list[dict]:
    results = rs.apply(measure, SPECS[kind], args.steps, args.warmup, args.dim, watch=roles)
    rs.execute("import gc; gc.collect()")
    return results


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--handwritten", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--driver-pid", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--with-prepare",
        action="store_true",
        help="also run the workbench's prepare under torchrun (hosting on engines alone; the CPU census says it too)",
    )
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--worlds", default="2,4")
    parser.add_argument(
        "--strategies", default=None, help=f"comma-separated subset of {', '.join(STRATEGIES[4])} (default: all)"
    )
    parser.add_argument("--quick", action="store_true", help="world 2, ddp and fsdp2, 1 repeat: checks the script only")
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    args = parser.parse_args(argv)
    if args.worker:
        return worker_main(args)
    if args.pool:
        return results.pool_report("strategy") or pooled_rows()  # 2: nothing saved yet
    os.environ.setdefault("IPYTHONDIR", str(ROOT / ".state" / "bench" / "ipython"))
    sys.path.insert(0, str(ROOT))
    import workbench

    if args.quick:
        args.steps, args.warmup = 3, 1
    run = results.Run("strategy", vars(args), quick=args.quick)
    worlds = [2] if args.quick else [int(w) for w in args.worlds.split(",")]
    chosen = args.strategies.split(",") if args.strategies else STRATEGIES[4]
    unknown = [k for k in chosen if k not in STRATEGIES[4]] + [w for w in worlds if w not in STRATEGIES]
    if unknown:
        parser.error(
            f"unknown {unknown}: strategies are {', '.join(STRATEGIES[4])}, worlds {', '.join(map(str, STRATEGIES))}"
        )
    rows = []
    repeats = 1 if args.quick else args.repeats
    sides = SIDES if args.with_prepare else SIDES[:2]
    census: dict = {}  # (world, side) -> {thread key: [ms/step, wake-ups/s]} summed over rounds
    for n in worlds:
        kinds = ["ddp", "fsdp2"] if args.quick else [k for k in STRATEGIES[n] if k in chosen]
        seen = {kind: {side: {"step": [], "uss": [], "outside": [], "faults": []} for side in sides} for kind in kinds}
        for i in range(repeats):
            # a fresh rank set each round, as each hand-written run is a fresh torchrun job: how
            # fast a set of processes runs the same steps is a draw of its own, and one set for
            # the whole run would give the workbench's side a single draw against five
            rs = workbench.start(n, backend="gloo", threads=1, sys_path=(str(HERE),))
            roles = workbench_roles(rs)
            try:
                for kind in kinds:
                    for side in sides[i % len(sides) :] + sides[: i % len(sides)]:
                        got = (
                            workbench_run(rs, kind, args, roles)
                            if side == "workbench"
                            else torchrun(kind, n, args, handwritten=side == "handwritten")
                        )
                        use = cpu_use(got, args.steps)
                        acc = seen[kind][side]
                        acc["step"].append(max(r["step_s"] for r in got))
                        acc["uss"].append(max(r["uss"] for r in got))
                        acc["outside"].append(use["outside_ms_per_step"])
                        acc["faults"].append(use["training_page_faults_per_step"])
                        for key, (ms, wake) in use["threads"].items():
                            th = census.setdefault((n, side), {}).setdefault(key, [0.0, 0.0, 0])
                            th[0], th[1], th[2] = th[0] + ms, th[1] + wake, th[2] + 1
                        run.rounds.append(
                            {
                                "world": n,
                                "strategy": kind,
                                "side": side,
                                "round": i,
                                "step_s": acc["step"][-1],
                                "uss": acc["uss"][-1],
                                "cpu": use,
                            }
                        )
            finally:
                workbench.stop()
        for kind in kinds:
            row = {"world": n, "strategy": kind}
            for side, acc in seen[kind].items():
                row[f"{side}_ms"] = statistics.median(acc["step"]) * 1e3
                row[f"{side}_uss_mb"] = statistics.median(acc["uss"]) / 2**20
                row[f"{side}_outside_cpu_ms"] = statistics.median(acc["outside"])
                row[f"{side}_page_faults_per_step"] = statistics.median(acc["faults"])
            row["ratio"] = row["workbench_ms"] / row["handwritten_ms"]
            row["ratio_interval_90"] = list(
                ratio_interval(seen[kind]["workbench"]["step"], seen[kind]["handwritten"]["step"])
            )
            if "torchrun" in seen[kind]:
                row["ratio_prepare"] = row["workbench_ms"] / row["torchrun_ms"]
            rows.append(row)
            run.target(f"{kind} x{n} workbench / hand-written torchrun", row["ratio"], "<=", 1.03)
            lo, hi = row["ratio_interval_90"]
            print(
                f"  {kind:>9} x{n}: workbench {row['workbench_ms']:7.1f} ms  hand-written "
                f"{row['handwritten_ms']:7.1f} ms  prepare under torchrun {row.get('torchrun_ms', float('nan')):7.1f} ms  "
                f"ratio {row['ratio']:.3f} (90% interval {lo:.3f}-{hi:.3f})  CPU outside the training threads "
                f"{row['workbench_outside_cpu_ms']:.1f} / {row['handwritten_outside_cpu_ms']:.1f} ms/step, "
                f"training threads' page faults {row['workbench_page_faults_per_step']:.0f} / "
                f"{row['handwritten_page_faults_per_step']:.0f} per step",
                flush=True,
            )
    print()
    print(
        f"median step time (slowest rank) and per-rank USS, {repeats} alternating runs of "
        f"{args.steps} steps; GPT dim {args.dim}, 4 layers, seq 64, batch 8; cpu count {os.cpu_count()}"
    )
    print(
        f"{'world':>5} {'strategy':>9} {'workbench ms':>13} {'by hand ms':>11} {'prepare@torchrun ms':>20} "
        f"{'ratio':>6} {'wb USS MB':>10} {'hand USS MB':>12} {'wb outside ms':>14} {'hand outside ms':>16}"
    )
    for r in rows:
        print(
            f"{r['world']:>5} {r['strategy']:>9} {r['workbench_ms']:>13.1f} {r['handwritten_ms']:>11.1f} "
            f"{r.get('torchrun_ms', float('nan')):>20.1f} {r['ratio']:>6.3f} {r['workbench_uss_mb']:>10.0f} "
            f"{r['handwritten_uss_mb']:>12.0f} {r['workbench_outside_cpu_ms']:>14.2f} "
            f"{r['handwritten_outside_cpu_ms']:>16.2f}"
        )
    threads = census_table(census)
    print()
    print(
        "CPU outside the training threads while the steps ran, summed over ranks, mean over rounds "
        "(ms per step; wake-ups per second):"
    )
    for line in census_lines(threads):
        print(line)
    run.summary = {"rows": rows, "threads": threads}
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
