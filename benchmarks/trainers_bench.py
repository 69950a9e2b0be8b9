"""What reporting another trainer's steps costs, and how fast each tracker keeps up.

Targets: a Hugging Face ``Trainer``'s steps/s with ``engine.hf_callback()`` / without >= 0.97,
one ``engine.report`` <= 1% of a step; each tracker writes >= 20 steps/s, twice the tiny
GPT's step rate (docs/trackers.md), so a tracker never falls behind a run (the method:
docs/figures.md). Saved as ``benchmarks/results/trainers-*.json``; exit 1 on a miss::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/trainers_bench.py [--steps 40] [--repeats 5] [--only hf|trackers]"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
import types

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "benchmarks"))
import results  # noqa: E402

HF_SETUP = """
import shutil, tempfile, time, torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments, logging
from workbench import engine
logging.set_verbosity_error()
_cfg = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
_g = torch.Generator().manual_seed(engine.rank)
_ids = torch.randint(0, 256, (8 * {steps}, 64), generator=_g)
_data = [{{"input_ids": x, "labels": x}} for x in _ids]

def _round(with_callback):
    torch.manual_seed(0)
    out = tempfile.mkdtemp(prefix="wb-bench-hf-")
    args = TrainingArguments(output_dir=out, use_cpu=True, report_to=[], max_steps={steps},
                             per_device_train_batch_size=8, logging_steps=1, save_strategy="no",
                             disable_tqdm=True, learning_rate=1e-3)
    cbs = [engine.hf_callback(run="bench-hf")] if with_callback else []
    tr = Trainer(model=LlamaForCausalLM(_cfg), args=args, train_dataset=_data, callbacks=cbs)
    t0 = time.perf_counter()
    tr.train()
    took = time.perf_counter() - t0
    shutil.rmtree(out, ignore_errors=True)  # the Trainer's output folder: nothing is saved in it
    return {steps} / took
"""


REPORT_COST = """
import time, torch
from workbench import engine
_x = torch.zeros(8, 64, dtype=torch.long)
def _report_cost(n):
    t0 = time.perf_counter()
    for i in range(n):
        engine.report(step=i + 1, loss=1.0, run="bench-report", batch=_x, lr=1e-3, grad_norm=0.5)
    return (time.perf_counter() - t0) / n
"""


def hf_rounds(repeats: int, steps: int) -> list[dict]:
    import workbench

    rs = workbench.start(2, backend="gloo", threads=1)
    try:
        rs.execute(HF_SETUP.format(steps=steps), timeout=600)
        rs.execute("_round(True); _round(False)", timeout=600)  # warm-up: imports, first builds
        rs.execute(REPORT_COST, timeout=600)
        rounds = []
        for i in range(repeats):  # what one engine.report costs the step that calls it
            rs.execute("_cost = _report_cost(500)", timeout=600)
            cost = statistics.median(rs.pull("_cost"))
            rounds.append({"part": "report", "seconds_per_call": cost})
            print(f"report round {i}: {cost * 1e6:.0f} us a call", flush=True)
        for i in range(repeats):
            for side in (True, False) if i % 2 == 0 else (False, True):
                rs.execute(f"_rate = _round({side})", timeout=600)
                rate = min(rs.pull("_rate"))  # the slower rank sets the pace
                rounds.append({"part": "hf", "callback": side, "steps_per_s": rate})
                print(f"hf round {i} callback={side}: {rate:.2f} steps/s", flush=True)
        return rounds
    finally:
        workbench.stop()


FEW = ("loss", "lr", "grad_norm", "tps", "time_step_s", "memory_rss_bytes")  # `--metrics` for MLflow's round


def trainer_rows(step: int, rank: int, seq: int) -> dict:
    """A step event shaped like the workbench trainer's (its metric and collective names)."""
    from workbench.shared import events

    metrics = {
        "loss": 4.0 / step,
        "loss_local": 4.0 / step + rank * 1e-3,
        "lr": 1e-3,
        "grad_norm": 0.5,
        "tps": 5000.0,
        "samples_per_s": 80.0,
        "mfu": None,
        "time_step_s": 0.1,
        "time_control_s": 0.001,
        **{f"time_{p}_s": 0.02 for p in events.STEP_TIME_PHASES},
        **{k: 1e8 for k in ("memory_rss_bytes", "memory_uss_bytes", "memory_max_rss_bytes")},
    }
    comm = {k: {"count": 1, "bytes": 139904, "time_s": 0.003} for k in ("all_reduce", "ddp_bucket", "broadcast")}
    return events.step_event(run="bench-run", rank=rank, step=step, metrics=metrics, comm=comm, t=time.time())


def tracker_rounds(repeats: int, steps: int) -> list[dict]:
    from workbench.notebook import trackers
    from workbench.notebook.session import Session
    from workbench.notebook.stream.store import EventStore
    from workbench.notebook.trackers.backends import BACKENDS

    rounds = []
    sides = [(kind, kind, None) for kind in trackers.KINDS] + [("mlflow-" + "+".join(FEW), "mlflow", FEW)]
    for i in range(repeats):
        for label, kind, patterns in sides:
            with tempfile.TemporaryDirectory(prefix=f"wb-bench-{kind}-") as folder:
                if kind == "trackio":  # trackio keeps the folder of its first import: one per process
                    folder = os.path.join(ROOT, ".state", "bench", "trackio")
                sess = Session(f"bench{i}")
                sess.rankset = types.SimpleNamespace(world_size=2, running=False, config=None)
                sess.store = EventStore()
                sess.checkpoints.root = os.path.join(folder, "no-checkpoints")
                tracker = trackers.Tracker(BACKENDS[kind](), sess, os.path.join(folder, kind), patterns)
                batch = [trainer_rows(s, r, s - 1) for s in range(1, steps + 1) for r in (0, 1)]
                t0 = time.perf_counter()
                for k in range(0, len(batch), 20):  # ~10 steps of 2 ranks a batch, as the collector gets them
                    sess.store.add(batch[k : k + 20])
                tracker.close()
                rate = steps / (time.perf_counter() - t0)
                assert tracker.steps_written == steps and not tracker.errors, tracker.info()
                rounds.append({"part": "tracker", "tracker": label, "steps_per_s": rate})
                print(f"tracker round {i} {label}: {rate:.1f} steps/s", flush=True)
    return rounds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=40, help="HF Trainer steps per round")
    p.add_argument("--repeats", type=int, default=5, help="rounds per side")
    p.add_argument("--tracker-steps", type=int, default=200, help="steps per tracker round")
    p.add_argument("--only", choices=("hf", "trackers"), default=None, help="run one part only")
    p.add_argument("--quick", action="store_true", help="a short run that only checks the script works")
    a = p.parse_args()
    if a.quick:
        a.steps, a.repeats, a.tracker_steps = 5, 1, 20
    run = results.Run("trainers", vars(a), quick=a.quick)
    if a.only != "hf":
        run.rounds += tracker_rounds(a.repeats, a.tracker_steps)
        for kind in ("tensorboard", "mlflow", "wandb", "trackio", "mlflow-" + "+".join(FEW)):
            rate = statistics.median(r["steps_per_s"] for r in run.rounds if r.get("tracker") == kind)
            run.summary[f"{kind}_steps_per_s"] = rate
            run.target(f"{kind} steps/s written (2 ranks, trainer's metrics)", rate, ">=", 20)
    if a.only != "trackers":
        run.rounds += hf_rounds(a.repeats, a.steps)
        hf = [r for r in run.rounds if r["part"] == "hf"]
        with_cb = statistics.median(r["steps_per_s"] for r in hf if r["callback"])
        without = statistics.median(r["steps_per_s"] for r in hf if not r["callback"])
        run.summary["hf_steps_per_s"] = {"with_callback": with_cb, "without": without}
        run.target("hf Trainer steps/s with callback / without", with_cb / without, ">=", 0.97)
        per_call = statistics.median(r["seconds_per_call"] for r in run.rounds if r["part"] == "report")
        run.summary["report_seconds_per_call"] = per_call
        # the resolvable figure: one report's cost against the step it is made in
        run.target("engine.report cost / HF step time (without)", per_call * without, "<=", 0.01)
    code = run.finish()
    try:
        import wandb

        wandb.teardown()  # the W&B service this process started
    except ImportError:
        pass
    return code


if __name__ == "__main__":
    sys.exit(main())
