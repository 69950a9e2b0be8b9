"""What full telemetry + the event stream cost, and how fast a stream the notebook keeps up with.

1. Steps/s of the same DDP training (GPT, AdamW, grad clipping, same data) run by the
   workbench Trainer on 2 persistent ranks with everything on (per-step control
   all-reduce, phase clocks, memory, collective wrappers and DDP comm hook, events
   PUSHed to the notebook's collector), against the same loop as a plain script under
   ``python -m torch.distributed.run --nproc-per-node 2`` with none of it; and, to tell
   the telemetry's cost apart from the rank processes', the same plain loop run on the
   workbench's ranks. Each run's median step time (robust to the stalls a shared 2-core
   machine has), median over ``--repeats`` interleaved rounds; target ratio >= 0.97.
2. The highest step-event rate from 4 ranks that the notebook's collector keeps up with:
   each rank emits realistic step events at a fixed rate for a few seconds; a rate is
   kept up with when every event arrives and the lag at the end is not growing.

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/telemetry_bench.py [--steps 60] [--repeats 5]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = dict(dim=96, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=256, max_seq_len=64)
BATCH = 16  # global
LR = 1e-3


def build(seed: int = 0):
    """Model, optimizer factory and per-rank data; identical for both sides."""
    import torch

    from workbench.models import GPT, GPTConfig, TextDataset

    torch.manual_seed(seed)
    cfg = GPTConfig(**MODEL)
    return GPT(cfg), TextDataset(cfg.max_seq_len)


def plain_loop(steps: int, warmup: int, ddp, opt, ds, rank: int, world: int) -> dict:
    """The baseline loop: plain DDP, no workbench code on the step path."""
    import torch

    from workbench.models import batch_at
    from workbench.strategies.base import lm_loss

    t0 = c0 = None
    ends = []
    for step in range(steps):
        if step == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        x, y = batch_at(ds, BATCH, step, dp_rank=rank, dp_size=world)
        opt.zero_grad(set_to_none=True)
        loss = lm_loss(ddp(x), y)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
        opt.step()
        float(loss)
        ends.append(time.perf_counter())
    return {"steps_per_s": (steps - warmup) / (time.perf_counter() - t0),
            "cpu_s_per_step": (time.process_time() - c0) / (steps - warmup),
            "median_step_s": statistics.median(b - a for a, b in zip(ends[warmup - 1:], ends[warmup:]))}


def _plain_setup():
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, ds = build()
    ddp = DDP(model)
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=LR), ds


def plain_main(steps: int, warmup: int) -> None:
    """The baseline under torchrun."""
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    out = plain_loop(steps, warmup, *_plain_setup(), rank, world)
    if rank == 0:
        print(json.dumps(out))
    dist.destroy_process_group()


_PLAIN: list = []


def plain_on_rank(steps: int, warmup: int) -> dict:
    """The same baseline loop in the workbench's rank processes (default group, no Trainer):
    tells the cost of the telemetry apart from that of the rank processes themselves."""
    import torch.distributed as dist

    if not _PLAIN:
        _PLAIN.append(_plain_setup())
    return plain_loop(steps, warmup, *_PLAIN[0], dist.get_rank(), dist.get_world_size())


def rank_setup() -> dict:
    """On each workbench rank: the same model and data under the Trainer (prepare ddp)."""
    import torch

    from workbench.engine.trainer import Trainer
    from workbench.models import batch_at
    from workbench.strategies import prepare

    model, ds = build()
    prepared = prepare(model, lambda p: torch.optim.AdamW(p, lr=LR), "ddp")
    r, n = prepared.dp_rank, prepared.dp_size
    t = Trainer(prepared, data=lambda i: batch_at(ds, BATCH, i, dp_rank=r, dp_size=n))
    _CPU.clear()
    t.add_hook(lambda rec: _CPU.__setitem__(rec["step"], time.process_time()), pauses=False)
    return t.status()


_CPU: dict = {}  # step -> process CPU seconds at its end (all threads of the rank process)


def cpu_marks() -> dict:
    return dict(_CPU)


def run_plain(steps: int, warmup: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", "29533",
           os.path.abspath(__file__), "--plain", "--steps", str(steps), "--warmup", str(warmup)]
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600, cwd=ROOT)
    for line in out.stdout.splitlines():
        if line.startswith("{"):
            return json.loads(line)
    raise RuntimeError(f"torchrun baseline failed:\n{out.stdout[-2000:]}\n{out.stderr[-3000:]}")


def run_workbench(rs, steps: int, warmup: int) -> tuple[float, dict]:
    from workbench import stream, training

    rs.apply(rank_setup)
    run = training.start(steps, rankset=rs)
    training.wait(rankset=rs, timeout=600)
    rows = sorted((r for r in stream.attach(rs).store.snapshot_rows(run) if r["rank"] == 0), key=lambda r: r["step"])
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), "steps missing from the stream"
    # step k's event is sent at the end of step k: time from end of `warmup` to end of `steps`
    t = {r["step"]: r["time"] for r in rows}
    rate = (steps - warmup) / (t[steps] - t[warmup])
    step_s = statistics.median(t[k] - t[k - 1] for k in range(warmup + 1, steps + 1))
    cpu = rs.apply(cpu_marks, ranks=[0])[0]
    cpu_per_step = (cpu[steps] - cpu[warmup]) / (steps - warmup)
    med = {k: statistics.median(r[k] for r in rows[warmup:]) for k in
           ("time_step_s", "time_control_s", "time_data_s", "time_forward_s", "time_backward_s", "time_optimizer_s")}
    med["cpu_s_per_step"] = cpu_per_step
    med["median_step_s"] = step_s
    return rate, med


# ------------------------------------------------------------------ event rate
def blast(rate_per_rank: float, seconds: float) -> int:
    """On a rank: emit step events at ``rate_per_rank``/s for ``seconds``; returns how many."""
    from workbench import events
    from workbench.engine import publisher, runtime

    rank = runtime.context().rank
    run = f"blast-{rate_per_rank:g}"
    metrics = {k: 0.123456789 for k in events.METRIC_DOCS}
    comm = {k: {"count": 3, "bytes": 123456, "time_s": 0.001} for k in ("all_reduce", "all_gather", "reduce_scatter")}
    n, t0, tick = 0, time.perf_counter(), 0.005
    total = int(rate_per_rank * seconds)
    while n < total:
        due = min(total, int((time.perf_counter() - t0) * rate_per_rank) + 1)
        while n < due:
            n += 1
            publisher.emit(events.step_event(run=run, rank=rank, step=n, metrics=metrics, comm=comm))
        time.sleep(tick)
    publisher.flush(30)
    return n


def event_rate(rs, rates: list[float], seconds: float = 3.0) -> list[dict]:
    from workbench import stream

    store = stream.attach(rs).store
    out = []
    for total in rates:
        per_rank = total / rs.world_size
        run = f"blast-{per_rank:g}"
        before = store.received
        t0 = time.time()
        call = rs.submit(blast, per_rank, seconds)
        lags = []
        while not call.ar.ready():
            time.sleep(0.25)
            lags.append(store.lag_s)
        call.result(timeout=120)
        expected = int(per_rank * seconds) * rs.world_size
        ok = store.wait(lambda s: len(s.snapshot_rows(run)) >= expected, timeout=5.0)
        took = time.time() - t0
        got = len(store.snapshot_rows(run))
        late = lags[3 * len(lags) // 4:] or [0.0]
        kept_up = ok and got == expected and max(late) < 1.0 and took < seconds + 2.0
        out.append({"events_per_s": total, "received": got, "expected": expected, "max_lag_s": round(max(late), 3),
                    "seconds": round(took, 2), "kept_up": kept_up, "gaps": store.gaps, "dups": store.duplicates})
        with store.lock:  # free the memory of the blast rows before the next rate
            store.rows.clear()
        del before
        if not kept_up:
            break
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--plain", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--warmup", type=int, default=10)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--rates", default="2000,5000,10000,20000,40000,80000")
    p.add_argument("--skip-overhead", action="store_true")
    args = p.parse_args()
    if args.plain:
        return plain_main(args.steps, args.warmup)
    sys.path.insert(0, ROOT)
    os.environ.setdefault("IPYTHONDIR", os.path.join(ROOT, ".state", "bench", "ipython"))
    from workbench import api

    # rank-side functions must come from an importable module, not this __main__
    from benchmarks import telemetry_bench as tb

    print(f"model {MODEL}, global batch {BATCH}, {args.steps} steps ({args.warmup} warm-up), "
          f"median of {args.repeats}; CPU gloo, OMP_NUM_THREADS=1, {os.cpu_count()} cores")
    if not args.skip_overhead:
        rs = api.start(2, backend="gloo", threads=1, sys_path=(ROOT,))
        try:
            plain, inrank, wb = [], [], []
            for i in range(args.repeats):  # interleaved, so slow spells of the machine hit all three
                plain.append(run_plain(args.steps, args.warmup))
                inrank.append(rs.apply(tb.plain_on_rank, args.steps, args.warmup, ranks=[0, 1])[0])
                rate, med = tb.run_workbench(rs, args.steps, args.warmup)
                wb.append({"steps_per_s": rate, **med})
                print(f"  round {i + 1}: median step (ms) torchrun plain {plain[-1]['median_step_s'] * 1e3:.1f}, "
                      f"plain loop on the ranks {inrank[-1]['median_step_s'] * 1e3:.1f}, "
                      f"workbench full telemetry {wb[-1]['median_step_s'] * 1e3:.1f}")
        finally:
            api.stop()

        def med(rows, key):
            return statistics.median(r[key] for r in rows)

        p, r, w = (med(x, "median_step_s") for x in (plain, inrank, wb))
        print(f"median step time: torchrun (no telemetry) {p * 1e3:.1f} ms, plain loop on the workbench ranks "
              f"{r * 1e3:.1f} ms, workbench (telemetry + stream) {w * 1e3:.1f} ms")
        print(f"steps/s ratio workbench / torchrun: {p / w:.3f} (target >= 0.97); "
              f"telemetry alone (workbench / plain loop on the same ranks): {r / w:.3f}")
        print(f"whole-run steps/s (sensitive to stalls): torchrun {med(plain, 'steps_per_s'):.2f}, "
              f"on the ranks {med(inrank, 'steps_per_s'):.2f}, workbench {med(wb, 'steps_per_s'):.2f}; "
              f"CPU ms/step of rank 0: {med(plain, 'cpu_s_per_step') * 1e3:.1f}, "
              f"{med(inrank, 'cpu_s_per_step') * 1e3:.1f}, {med(wb, 'cpu_s_per_step') * 1e3:.1f}")
        m = sorted(wb, key=lambda d: d["time_step_s"])[len(wb) // 2]
        print("workbench step, median (ms): " + ", ".join(f"{k[5:-2]} {v * 1e3:.1f}" for k, v in m.items()
                                                          if k.startswith("time_")))
    rs = api.start(4, backend="gloo", threads=1, sys_path=(ROOT,))
    try:
        rates = [float(r) for r in args.rates.split(",")]
        results = tb.event_rate(rs, rates)
    finally:
        api.stop()
    for r in results:
        print(f"  {r['events_per_s']:>8.0f} step events/s from 4 ranks: received {r['received']}/{r['expected']} "
              f"in {r['seconds']} s, lag (last quarter) max {r['max_lag_s']} s -> {'kept up' if r['kept_up'] else 'FELL BEHIND'}")
    best = max((r["events_per_s"] for r in results if r["kept_up"]), default=0)
    print(f"highest step-event rate the notebook keeps up with (4 ranks): {best:.0f} events/s")


if __name__ == "__main__":
    main()
