"""Edit-run loop: re-running a training cell on live ranks against relaunching a script.

Target: re-running the cell on live ranks at least 10x faster than relaunching it under
``torchrun`` (Accelerate's ``notebook_launcher`` reported beside it; the method:
docs/figures.md). Run: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/edit_loop_bench.py``
(``--quick``: one round, checks the script only; ``--pool``: every saved run). Results:
``benchmarks/results/edit_loop-*.json``; exit status 1 when the target is missed."""

from __future__ import annotations

import argparse
import io
import os
import pathlib
import signal
import statistics
import subprocess
import sys
import time
from contextlib import redirect_stdout

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))
import results  # noqa: E402

STEPS = 20


def train(steps: int = STEPS) -> float:
    """The training code all three sides run: a fresh tiny GPT under DDP, ``steps`` steps."""
    import torch
    import torch.distributed as dist

    from workbench.models import GPT, GPTConfig, TextDataset, batch_at
    from workbench.strategies import prepare

    torch.manual_seed(0)
    prepared = prepare(GPT(GPTConfig.tiny()), lambda ps: torch.optim.AdamW(ps, lr=1e-3), "ddp")
    data = TextDataset(seq_len=32)
    loss = 0.0
    for step in range(steps):
        loss = prepared.train_step(batch_at(data, 8, step, dp_rank=dist.get_rank(), dp_size=dist.get_world_size()))
    prepared.close()
    return loss


def worker_main() -> None:
    """torchrun's side: one rank of the script."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    loss = train()
    if dist.get_rank() == 0:
        print(f"LOSS {loss}", flush=True)
    dist.destroy_process_group()


def launched(rank_count: int) -> float:
    """Accelerate's side: the function ``notebook_launcher`` forks on every run."""
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    if not dist.is_initialized():
        dist.init_process_group("gloo")
    train()
    dist.destroy_process_group()


def run_group(cmd: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in a session of its own; on a timeout end that whole group (its workers too)."""
    proc = subprocess.Popen(
        cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.communicate()
        raise
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def run_torchrun(n: int) -> float:
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE)]))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc-per-node={n}",
        str(pathlib.Path(__file__)),
        "--worker",
    ]
    t0 = time.perf_counter()
    out = run_group(cmd, env, timeout=300)
    elapsed = time.perf_counter() - t0
    if "LOSS " not in out.stdout:
        raise RuntimeError(f"torchrun failed (exit {out.returncode}):\n{out.stderr[-2000:]}")
    return elapsed


def run_notebook_launcher(n: int) -> float:
    """``accelerate.notebook_launcher`` in a child interpreter, as a notebook kernel would call it."""
    from workbench.engine.runtime import free_port

    env = dict(os.environ, OMP_NUM_THREADS="1")
    for _ in range(3):  # the port is free when chosen, then taken by anyone meanwhile (the launcher imports first)
        code = (
            f"import sys, time; sys.path[:0] = [{str(ROOT)!r}, {str(HERE)!r}]\n"
            "from accelerate import notebook_launcher\nimport edit_loop_bench as b\n"
            "t0 = time.perf_counter()\n"
            f"notebook_launcher(b.launched, args=({n},), num_processes={n}, use_port='{free_port()}')\n"
            "print('ELAPSED', time.perf_counter() - t0, flush=True)\n"
        )
        out = run_group([sys.executable, "-c", code], env, timeout=300)
        for line in out.stdout.splitlines():
            if line.startswith("ELAPSED "):
                return float(line.split()[1])
        if "EADDRINUSE" not in out.stderr:
            break
    raise RuntimeError(f"notebook_launcher failed (exit {out.returncode}):\n{out.stderr[-2000:]}")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("-n", type=int, default=2)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--no-accelerate", action="store_true", help="leave out notebook_launcher")
    p.add_argument("--quick", action="store_true", help="one round: checks the script only")
    p.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    a = p.parse_args(argv)
    if a.worker:
        worker_main()
        return 0
    if a.pool:
        return results.pool_report("edit_loop")
    if a.quick:
        a.rounds = 1
    run = results.Run("edit_loop", vars(a), quick=a.quick)
    os.environ.setdefault("IPYTHONDIR", str(ROOT / ".state" / "bench" / "ipython"))
    os.makedirs(os.environ["IPYTHONDIR"], exist_ok=True)
    from IPython.testing.globalipapp import get_ipython

    import workbench

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    with redirect_stdout(io.StringIO()):
        ip.run_line_magic("distrain", f"start -n {a.n} --backend gloo")
    cell = "import edit_loop_bench as _b\n_loss = _b.train()\n"
    try:
        workbench.apply(lambda p: __import__("sys").path.insert(0, p), str(HERE))
        with redirect_stdout(io.StringIO()):
            ip.run_cell_magic("distrain", "", cell)  # the first run imports the model code
        for i in range(a.rounds):
            row = {}
            t0 = time.perf_counter()
            with redirect_stdout(io.StringIO()):
                ip.run_cell_magic("distrain", "", cell)
            row["workbench_s"] = time.perf_counter() - t0
            row["torchrun_s"] = run_torchrun(a.n)
            if not a.no_accelerate:
                row["notebook_launcher_s"] = run_notebook_launcher(a.n)
            run.rounds.append(row)
            print(f"round {i + 1}: " + ", ".join(f"{k} {v:.3f}" for k, v in row.items()), flush=True)
        losses = workbench.pull("_loss")
    finally:
        workbench.stop()
    assert len(set(losses)) == 1, f"ranks disagree on the loss: {losses}"
    med = {k: statistics.median(r[k] for r in run.rounds) for k in run.rounds[0]}
    run.summary = {f"median_{k}": v for k, v in med.items()}
    print(f"edit-run loop on {a.n} ranks, median of {a.rounds} rounds (build model + DDP + {STEPS} steps):")
    for k, v in med.items():
        print(f"  {k[:-2]:<18} {v:8.3f} s")
    run.target("torchrun / workbench", med["torchrun_s"] / med["workbench_s"], ">=", 10.0)
    if "notebook_launcher_s" in med:
        run.summary["notebook_launcher / workbench"] = med["notebook_launcher_s"] / med["workbench_s"]
        print(f"  notebook_launcher / workbench: {run.summary['notebook_launcher / workbench']:.1f}x")
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
