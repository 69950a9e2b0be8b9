"""What full telemetry + the event stream cost, and how fast a stream the notebook keeps up with.

Targets: steps/s of the workbench trainer with everything on / the same loop under plain
``torchrun`` >= 0.97; the notebook keeps up with 10,000 step events/s from 4 ranks (the
method: docs/figures.md). Saved as ``benchmarks/results/telemetry-*.json`` (``--pool``: every
saved run; ``--quick``: checks the script only); exit status 1 on a miss::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/telemetry_bench.py [--steps 30] [--repeats 30] [--segments 10]"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import results  # noqa: E402

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


def plain_step(ddp, opt, x, y) -> float:
    """The baseline step: plain DDP, no workbench code on the step path."""
    import torch

    from workbench.strategies.base import lm_loss

    opt.zero_grad(set_to_none=True)
    loss = lm_loss(ddp(x), y)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(ddp.parameters(), 1.0)
    opt.step()
    return float(loss)


def plain_loop(steps: int, warmup: int, ddp, opt, ds, rank: int, world: int) -> dict:
    """The baseline loop: :func:`plain_step` on this rank's share of the data."""
    from workbench.models import batch_at

    t0 = c0 = None
    ends = []
    for step in range(steps):
        if step == warmup:
            t0, c0 = time.perf_counter(), time.process_time()
        plain_step(ddp, opt, *batch_at(ds, BATCH, step, dp_rank=rank, dp_size=world))
        ends.append(time.perf_counter())
    return {
        "steps_per_s": (steps - warmup) / (time.perf_counter() - t0),
        "cpu_s_per_step": (time.process_time() - c0) / (steps - warmup),
        "step_s": [b - a for a, b in zip(ends[warmup - 1 :], ends[warmup:])],
    }


def _plain_setup():
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    model, ds = build()
    ddp = DDP(model)
    return ddp, torch.optim.AdamW(ddp.parameters(), lr=LR), ds


def plain_serve(port: int, warmup: int) -> None:
    """The baseline under torchrun, kept alive between rounds: rank 0 reads the steps of the
    next round from the driver's socket (a blocking read: a waiting baseline costs the side
    being measured no wake-up), both ranks run the
    loop, rank 0 writes the round's figures back; 0 ends it. Persistent like the
    workbench's ranks, so rounds of the two sides can alternate every few seconds and a
    slow spell of the machine hits both."""
    import socket

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    conn = lines = None
    if rank == 0:
        conn = socket.create_connection(("127.0.0.1", port))
        lines = conn.makefile("rw")
    while True:
        cmd = torch.tensor([int(lines.readline() or 0) if rank == 0 else 0], dtype=torch.int64)
        dist.broadcast(cmd, src=0)
        if cmd.item() <= 0:
            break
        out = plain_loop(int(cmd.item()), warmup, *_fresh(), rank, world)
        if rank == 0:
            lines.write(json.dumps(out) + "\n")
            lines.flush()
    if conn is not None:
        conn.close()
    dist.destroy_process_group()


class PlainServer:
    """Driver side of :func:`plain_serve`: one torchrun, many rounds."""

    def __init__(self, warmup: int):
        import socket
        import tempfile

        base = os.path.join(ROOT, ".state", "bench")
        os.makedirs(base, exist_ok=True)
        self.folder = tempfile.mkdtemp(prefix="plain-", dir=base)
        listener = socket.create_server(("127.0.0.1", 0))
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": ROOT}
        with socket.create_server(("127.0.0.1", 0)) as probe:  # a free port: a job per segment
            master_port = str(probe.getsockname()[1])
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            "2",
            "--master-port",
            master_port,
            os.path.abspath(__file__),
            "--serve",
            str(listener.getsockname()[1]),
            "--warmup",
            str(warmup),
        ]
        self._log = open(os.path.join(self.folder, "torchrun.log"), "w")
        # its own session, so that close() can end exactly torchrun and its two workers
        self.proc = subprocess.Popen(
            cmd, env=env, cwd=ROOT, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True
        )
        listener.settimeout(1.0)
        deadline = time.monotonic() + 300
        self.conn = None
        while self.conn is None:
            try:
                self.conn, _ = listener.accept()
            except TimeoutError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self._failed()
        listener.close()
        self.conn.settimeout(1.0)
        self._reply = b""

    def _failed(self):
        with open(self._log.name) as f:
            log = f.read()
        errors = [line for line in log.splitlines() if "Error" in line]
        raise RuntimeError(
            f"torchrun baseline failed (exit {self.proc.poll()}): " + "\n".join(errors[:5]) + f"\n...\n{log[-2000:]}"
        )

    def run(self, steps: int, timeout: float = 600.0) -> dict:

        self.conn.sendall(f"{steps}\n".encode())
        deadline = time.monotonic() + timeout
        while b"\n" not in self._reply:
            try:
                chunk = self.conn.recv(65536)
            except TimeoutError:
                chunk = None
            if chunk == b"" or self.proc.poll() is not None or time.monotonic() > deadline:
                self._failed()
            self._reply += chunk or b""
        line, self._reply = self._reply.split(b"\n", 1)
        return json.loads(line)

    def close(self) -> None:
        import shutil
        import signal

        try:
            self.conn.sendall(b"0\n")
        except OSError:
            pass
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)
        self.conn.close()
        self._log.close()
        shutil.rmtree(self.folder, ignore_errors=True)


_PLAIN: list = []


def _fresh():
    """A new model, optimizer and data for a round, on every side.

    Each round is a training run of its own, built anew like the workbench side's
    (``rank_setup``). Where the baselines kept one model for all rounds, every round of a
    run ran on the one memory layout that model happened to get, and how fast a layout
    runs varies: in three runs of alternating rounds on the same ranks, the trainer (a
    fresh model each round) ran 0.90, 0.97 and 1.01x as fast as the plain loop on its one
    model, and the ratio carried that draw whole. Built fresh, the layouts vary from round
    to round on every side alike, and the interval covers it.
    """
    _PLAIN[:] = [_plain_setup()]  # the new one is built before the old is let go, as on the workbench side
    return _PLAIN[0]


def plain_on_rank(steps: int, warmup: int) -> dict:
    """The same baseline loop in the workbench's rank processes (default group, no Trainer):
    tells the cost of the telemetry apart from that of the rank processes themselves."""
    import torch.distributed as dist

    return plain_loop(steps, warmup, *_fresh(), dist.get_rank(), dist.get_world_size())


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


def interleaved_on_rank(steps: int) -> dict:
    """On each rank, step by step on the same model, optimizer and data: a plain step, then
    one trainer step (``Trainer._one_step``: agreement, phase clocks, DDP clock, memory, the
    event), alternating. A slow spell of the machine hits both alike, so the medians tell
    the trainer's own per-step cost more finely than whole runs can."""
    from workbench.engine import trainer as tr

    t = tr.current()
    t.target = t.step + steps
    times: dict = {"plain": [], "trainer": []}
    for i in range(2 * steps):
        t0 = time.perf_counter()
        if i % 2 == 0:
            plain_step(t.model, t.optimizer, *t._data(10_000 + i))
            times["plain"].append(time.perf_counter() - t0)
        else:
            t._one_step(0.0)
            t._agreed = None  # the loop would act on these flags at its next step
            times["trainer"].append(time.perf_counter() - t0)
    return {k: statistics.median(v[3:]) for k, v in times.items()}


def run_workbench(rs, steps: int, warmup: int) -> tuple[float, dict]:
    from workbench.notebook import stream, training

    rs.apply(rank_setup)
    run = training.start(steps, rankset=rs)
    training.wait(rankset=rs, timeout=600)
    rows = sorted((r for r in stream.attach(rs).store.snapshot_rows(run) if r["rank"] == 0), key=lambda r: r["step"])
    assert [r["step"] for r in rows] == list(range(1, steps + 1)), "steps missing from the stream"
    # step k's event is sent at the end of step k: time from end of `warmup` to end of `steps`
    t = {r["step"]: r["time"] for r in rows}
    rate = (steps - warmup) / (t[steps] - t[warmup])
    step_s = [t[k] - t[k - 1] for k in range(warmup + 1, steps + 1)]
    cpu = rs.apply(cpu_marks, ranks=[0])[0]
    cpu_per_step = (cpu[steps] - cpu[warmup]) / (steps - warmup)
    med = {
        k: statistics.median(r[k] for r in rows[warmup:])
        for k in (
            "time_step_s",
            "time_control_s",
            "time_data_s",
            "time_forward_s",
            "time_backward_s",
            "time_optimizer_s",
        )
    }
    med["cpu_s_per_step"] = cpu_per_step
    med["step_s"] = step_s
    return rate, med


# ------------------------------------------------------------------ event rate
def blast(rate_per_rank: float, seconds: float) -> int:
    """On a rank: emit step events at ``rate_per_rank``/s for ``seconds``; returns how many."""
    from workbench.engine import publisher, runtime
    from workbench.shared import events

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
    from workbench.notebook import stream

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
        ok = store.wait(lambda s, run=run, expected=expected: len(s.snapshot_rows(run)) >= expected, timeout=5.0)
        took = time.time() - t0
        got = len(store.snapshot_rows(run))
        late = lags[3 * len(lags) // 4 :] or [0.0]
        kept_up = ok and got == expected and max(late) < 1.0 and took < seconds + 2.0
        out.append(
            {
                "events_per_s": total,
                "received": got,
                "expected": expected,
                "max_lag_s": round(max(late), 3),
                "seconds": round(took, 2),
                "kept_up": kept_up,
                "gaps": store.gaps,
                "dups": store.duplicates,
            }
        )
        with store.lock:  # free the memory of the blast rows before the next rate
            store.rows.clear()
        del before
        if not kept_up:
            break
    return out


def overhead(args) -> list[dict]:
    """Segments of rounds, each on a fresh torchrun job and a fresh workbench rank set; in a
    segment the three sides alternate round by round (order rotating). Then the step-by-step
    comparison on the last segment's ranks."""
    from benchmarks import telemetry_bench as tb
    from workbench.notebook import api
    from workbench.notebook.dashboard import Dashboard

    rows: list[dict] = []
    inter, redraws = None, 0
    per_segment = max(1, round(args.repeats / args.segments))
    for seg in range(args.segments):
        server = tb.PlainServer(args.warmup)
        rs = api.start(2, backend="gloo", threads=1, sys_path=(ROOT,))
        # the notebook side as a user has it: stream collector and a live dashboard redrawing
        # every 0.5 s (no browser here: edits are not held for one to draw them)
        dash = Dashboard(rs, interval=0.5)
        dash.VIEW_TIMEOUT = 0.0
        try:
            sides = {
                "torchrun": lambda server=server: server.run(args.steps),
                "on_ranks": lambda rs=rs: rs.apply(tb.plain_on_rank, args.steps, args.warmup, ranks=[0, 1])[0],
                "workbench": lambda rs=rs: tb.run_workbench(rs, args.steps, args.warmup)[1],
            }
            names = list(sides)
            for _ in range(per_segment):
                k = len(rows)
                row: dict = {"segment": seg}
                for name in names[k % 3 :] + names[: k % 3]:
                    row[name] = sides[name]()
                    row[name]["median_step_s"] = statistics.median(row[name]["step_s"])
                rows.append(row)
                print(
                    f"  segment {seg + 1} round {k + 1}: median step (ms) torchrun plain "
                    f"{row['torchrun']['median_step_s'] * 1e3:.1f}, plain loop on the ranks "
                    f"{row['on_ranks']['median_step_s'] * 1e3:.1f}, workbench full telemetry "
                    f"{row['workbench']['median_step_s'] * 1e3:.1f}",
                    flush=True,
                )
            if seg == args.segments - 1:
                inter = rs.apply(tb.interleaved_on_rank, args.interleaved, ranks=[0, 1])
            redraws += dash.redraws
        finally:
            dash.close()
            api.stop()
            server.close()

    report(rows)
    print(f"dashboard redraws during the rounds: {redraws}")
    for r, d in enumerate(inter):
        print(
            f"step by step on rank {r} ({args.interleaved} of each, alternating): plain {d['plain'] * 1e3:.2f} ms, "
            f"trainer {d['trainer'] * 1e3:.2f} ms, ratio {d['plain'] / d['trainer']:.3f}"
        )
    return rows


def report(rows: list[dict]) -> None:
    """The ratios of the three sides over ``rows`` (one run's, or several runs' pooled)."""

    def med(side, key="median_step_s"):
        return statistics.median(r[side][key] for r in rows)

    segments = sorted({r["segment"] for r in rows})
    print(
        f"median step time: torchrun (no telemetry) {med('torchrun') * 1e3:.1f} ms, plain loop on the workbench "
        f"ranks {med('on_ranks') * 1e3:.1f} ms, workbench (telemetry + stream + dashboard) {med('workbench') * 1e3:.1f} ms"
    )
    for a, b, what in (
        ("torchrun", "workbench", "workbench / torchrun (target >= 0.97)"),
        ("on_ranks", "workbench", "telemetry alone (workbench / plain loop on the same ranks)"),
        ("torchrun", "on_ranks", "the rank processes (plain loop on the ranks / torchrun)"),
    ):
        pooled, (lo, hi) = pooled_ratio(rows, a, b)
        each = [ratio([r for r in rows if r["segment"] == s], a, b) for s in segments]
        print(
            f"steps/s ratio {what}: {pooled:.3f} (90% interval {lo:.3f}-{hi:.3f}); per segment "
            + (
                " ".join(f"{x:.3f}" for x in each)
                if len(each) <= 12
                else f"{min(each):.3f}-{max(each):.3f} ({len(each)} segments)"
            )
        )
    print(
        f"CPU ms/step of rank 0: torchrun {med('torchrun', 'cpu_s_per_step') * 1e3:.1f}, on the ranks "
        f"{med('on_ranks', 'cpu_s_per_step') * 1e3:.1f}, workbench {med('workbench', 'cpu_s_per_step') * 1e3:.1f}"
    )
    m = sorted((r["workbench"] for r in rows), key=lambda d: d["time_step_s"])[len(rows) // 2]
    print(
        "workbench step, median (ms): "
        + ", ".join(f"{k[5:-2]} {v * 1e3:.1f}" for k, v in m.items() if k.startswith("time_"))
    )


def pool(paths: list[str]) -> None:
    """Report the rounds of several saved runs together (every saved run when none is named)."""
    docs = [json.loads(pathlib.Path(p).read_text()) for p in paths] if paths else results.saved("telemetry")
    rows = []
    for i, doc in enumerate(docs):
        for r in doc["rounds"]:
            rows.append({**r, "segment": (i, r["segment"])})
    print(f"{len(docs)} runs, {len(rows)} rounds in {len({r['segment'] for r in rows})} segments, pooled:")
    report(rows)


def ratio(rows: list[dict], a: str, b: str) -> float:
    """Steps/s of side ``b`` over side ``a``: the median of all of ``a``'s step times over the
    median of all of ``b``'s, pooled over the rounds (the sides alternate, so both sample
    the machine's slow and fast spells alike)."""
    return statistics.median(x for r in rows for x in r[a]["step_s"]) / statistics.median(
        x for r in rows for x in r[b]["step_s"]
    )


def pooled_ratio(rows: list[dict], a: str, b: str, resamples: int = 2000) -> tuple[float, tuple]:
    """:func:`ratio` and a 90% bootstrap interval that resamples the segments (process sets),
    then the rounds within each: it holds both how fast a process set happens to run and
    the spread from round to round."""
    import random

    by_segment: dict = {}
    for r in rows:
        by_segment.setdefault(r.get("segment", 0), []).append(r)
    groups = list(by_segment.values())
    rng = random.Random(0)
    boot = []
    for _ in range(resamples):
        picked = []
        for group in (rng.choice(groups) for _ in groups):
            picked += [rng.choice(group) for _ in group]
        boot.append(ratio(picked, a, b))
    boot.sort()
    return ratio(rows, a, b), (boot[int(0.05 * resamples)], boot[int(0.95 * resamples) - 1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--serve", help=argparse.SUPPRESS)
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--repeats", type=int, default=30, help="rounds in all")
    p.add_argument("--segments", type=int, default=10, help="fresh torchrun job and workbench rank set for each")
    p.add_argument("--interleaved", type=int, default=200, help="steps of each kind in the step-by-step comparison")
    p.add_argument("--rates", default="2000,5000,10000,20000,40000,80000")
    p.add_argument("--skip-overhead", action="store_true")
    p.add_argument("--quick", action="store_true", help="2 rounds, 1 segment, one event rate: checks the script only")
    p.add_argument(
        "--pool",
        nargs="*",
        metavar="FILE",
        help="report saved runs together (every saved run under benchmarks/results/ when no FILE); run nothing",
    )
    args = p.parse_args(argv)
    if args.serve:
        return plain_serve(int(args.serve), args.warmup)
    if args.pool is not None:
        return pool(args.pool)
    if args.quick:
        args.repeats, args.segments, args.steps, args.warmup, args.interleaved = 2, 1, 5, 2, 10
        args.rates = "2000"
    sys.path.insert(0, ROOT)
    os.environ.setdefault("IPYTHONDIR", os.path.join(ROOT, ".state", "bench", "ipython"))
    os.makedirs(os.environ["IPYTHONDIR"], exist_ok=True)
    # rank-side functions must come from an importable module, not this __main__
    from benchmarks import telemetry_bench as tb
    from workbench.notebook import api

    run = results.Run("telemetry", vars(args), quick=args.quick)
    print(
        f"model {MODEL}, global batch {BATCH}, {args.steps} steps ({args.warmup} warm-up), "
        f"{args.repeats} rounds in {args.segments} segments; CPU gloo, OMP_NUM_THREADS=1, {os.cpu_count()} cores"
    )
    if not args.skip_overhead:
        run.rounds = overhead(args)
        pooled, (lo, hi) = pooled_ratio(run.rounds, "torchrun", "workbench")
        run.summary["workbench_over_torchrun"] = {"ratio": pooled, "interval_90": [lo, hi]}
        run.target("steps/s workbench / torchrun", pooled, ">=", 0.97)
    rs = api.start(4, backend="gloo", threads=1, sys_path=(ROOT,))
    try:
        rates = [float(r) for r in args.rates.split(",")]
        rate_rows = tb.event_rate(rs, rates)
    finally:
        api.stop()
    for r in rate_rows:
        print(
            f"  {r['events_per_s']:>8.0f} step events/s from 4 ranks: received {r['received']}/{r['expected']} "
            f"in {r['seconds']} s, lag (last quarter) max {r['max_lag_s']} s -> {'kept up' if r['kept_up'] else 'FELL BEHIND'}"
        )
    best = max((r["events_per_s"] for r in rate_rows if r["kept_up"]), default=0)
    print(f"highest step-event rate the notebook keeps up with (4 ranks): {best:.0f} events/s")
    run.summary["event_rates"] = rate_rows
    run.target("step events/s kept up with (4 ranks)", best, ">=", 10000)
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
