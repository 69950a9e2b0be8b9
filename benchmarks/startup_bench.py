"""Start-up: from a new notebook kernel to ranks with an initialised process group.

Three ways, side by side through ``jupyter_client`` (a real kernel each time),
interleaved per round so that all see the same machine load:

- ``workbench``: ``%load_ext workbench`` + ``%distrain start -n N --backend gloo``;
- ``ipyparallel``: raw ipyparallel, ``Cluster(n=N).start_and_connect_sync()`` then
  ``init_process_group`` on every engine (what the workbench builds on);
- ``jupyter-distributed`` (PyPI), in a venv of its own: its kernel with
  ``JUPYTER_DISTRIBUTED_WORLD_SIZE=N``, then the user's ``init_process_group`` cell;
- ``workbench-ray``: ``%distrain start -n N --backend gloo --launcher ray`` on a Ray
  cluster that is already up (a head on this host with N CPUs, started once by this
  script for all rounds, like a Slurm cluster is there before a job; ended by pid).

Each figure is kernel start request -> the reply of the cell that leaves every rank's
process group initialised. Results (medians, every run, load average) go to
``benchmarks/results/startup-*.json`` (``--pool``: every saved run); exit 1 on a miss.

Set up the other tool once (its own venv; torch comes from the shared venv through a
``.pth`` file placed after its own packages):
    python3 -m venv .state/jd/venv && .state/jd/venv/bin/pip install jupyter-distributed
    echo $PWD/.venv/lib/python3.11/site-packages > \
        .state/jd/venv/lib/python3.11/site-packages/zz_shared_torch.pth
Run: ``OMP_NUM_THREADS=1 python benchmarks/startup_bench.py --sizes 2 4 --rounds 3``
Ray beside the local launcher: ``... --sizes 4 --tools workbench workbench-ray``
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
import results  # noqa: E402

STATE = ROOT / ".state" / "startup_bench"
JD_PYTHON = ROOT / ".state" / "jd" / "venv" / "bin" / "python"

INIT = (
    "import os, datetime, torch.distributed as dist\n"
    "dist.init_process_group('gloo', init_method=f\"tcp://127.0.0.1:{os.environ['MASTER_PORT']}\", "
    "rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE']))\n"
    "print(dist.is_initialized())"
)

IPP = """
import ipyparallel as ipp, socket
cluster = ipp.Cluster(n={n})
rc = cluster.start_and_connect_sync(activate=False)
rc.wait_for_engines({n}, timeout=120)
with socket.socket() as s:
    s.bind(('127.0.0.1', 0)); port = s.getsockname()[1]
def init(rank, n, port):
    import datetime, torch.distributed as dist
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{{port}}', rank=rank, world_size=n)
    return dist.is_initialized()
ars = [rc[e].apply_async(init, r, {n}, port) for r, e in enumerate(sorted(rc.ids))]
assert all(a.get(timeout=120) for a in ars)
"""


def run_cell(kc, code, timeout=300):
    msg_id = kc.execute(code)
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"cell failed: {reply['content'].get('evalue')}")
            return


def one(tool: str, n: int) -> float:
    from jupyter_client import KernelManager
    from jupyter_client.kernelspec import KernelSpecManager

    env = dict(os.environ)
    for var, sub in (("JUPYTER_RUNTIME_DIR", "runtime"), ("IPYTHONDIR", "ipython")):
        env[var] = str(STATE / sub)
        (STATE / sub).mkdir(parents=True, exist_ok=True)
    if tool == "jupyter-distributed":
        spec_dir = STATE / "kernels" / "jd"
        spec_dir.mkdir(parents=True, exist_ok=True)
        (spec_dir / "kernel.json").write_text(
            json.dumps(
                {
                    "argv": [str(JD_PYTHON), "-m", "jupyter_distributed.kernel", "-f", "{connection_file}"],
                    "display_name": "jupyter-distributed",
                    "language": "python",
                }
            )
        )
        env.update(
            JUPYTER_DISTRIBUTED_WORLD_SIZE=str(n),
            JUPYTER_DISTRIBUTED_BASE_KERNEL="python3",
            JUPYTER_DISTRIBUTED_CWD=str(STATE),
        )
        env.pop("PYTHONPATH", None)
        km = KernelManager(
            kernel_name="jd", kernel_spec_manager=KernelSpecManager(kernel_dirs=[str(STATE / "kernels")])
        )
        code = INIT
    else:
        km = KernelManager(kernel_name="python3")
        code = f"%load_ext workbench\n%distrain start -n {n} --backend gloo" if tool == "workbench" else IPP.format(n=n)
        if tool == "workbench-ray":
            code = f"%load_ext workbench\n%distrain start -n {n} --backend gloo --launcher ray --address {RAY_HEAD}"
    t0 = time.perf_counter()
    km.start_kernel(env=env, cwd=str(STATE))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        run_cell(kc, code)
        elapsed = time.perf_counter() - t0
        if tool in ("workbench", "workbench-ray"):
            run_cell(kc, "import workbench; workbench.stop()")
        elif tool == "ipyparallel":
            run_cell(kc, "rc.close(); cluster.stop_cluster_sync()")
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)
    return elapsed


RAY_HEAD = ""  # address of the Ray head started by ray_head()


def ray_head(cpus: int):
    """A Ray head on this host for the ``workbench-ray`` rounds; returns a function that ends it by pid."""
    import subprocess

    global RAY_HEAD
    sys.path.insert(0, str(ROOT))
    from tests.cluster.ray_nodes import RAY, RAY_ENV, _ports, free_port, session_pids

    port = free_port()
    log = STATE / "ray-head.out"
    cmd = [*RAY, "start", "--head", "--block", "--port", str(port), "--node-ip-address", "127.0.0.1"]
    cmd += ["--num-cpus", str(cpus), "--disable-usage-stats", "--include-dashboard=false", *_ports()]
    proc = subprocess.Popen(
        cmd, stdout=open(log, "wb"), stderr=subprocess.STDOUT, start_new_session=True, env={**os.environ, **RAY_ENV}
    )
    deadline = time.monotonic() + 300
    while "Ray runtime started" not in log.read_text(errors="replace"):
        if proc.poll() is not None or time.monotonic() > deadline:
            sys.exit("the Ray head did not start:\n" + log.read_text(errors="replace")[-2000:])
        time.sleep(0.5)
    RAY_HEAD = f"127.0.0.1:{port}"

    def end() -> None:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            pass
        for pid in session_pids(proc.pid):
            try:
                os.kill(pid, 9)
            except OSError:
                pass
        proc.wait(10)

    return end


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tools", nargs="+", default=["workbench", "ipyparallel", "jupyter-distributed"])
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    args = parser.parse_args(argv)
    if args.pool:
        return results.pool_report("startup")
    if "jupyter-distributed" in args.tools and not JD_PYTHON.exists():
        sys.exit(f"jupyter-distributed is not set up at {JD_PYTHON}: see this script's docstring")
    STATE.mkdir(parents=True, exist_ok=True)
    end_ray = ray_head(max(args.sizes)) if "workbench-ray" in args.tools else None
    try:
        return _measure(args)
    finally:
        if end_ray is not None:
            end_ray()


def _measure(args) -> int:
    run = results.Run("startup", vars(args))
    runs: dict[str, dict[str, list[float]]] = {str(n): {t: [] for t in args.tools} for n in args.sizes}
    for r in range(args.rounds):
        for n in args.sizes:
            for tool in args.tools:
                s = one(tool, n)
                runs[str(n)][tool].append(s)
                run.rounds.append({"round": r, "ranks": n, "tool": tool, "seconds": s})
                print(f"round {r + 1}, {n} ranks, {tool}: {s:.2f} s", flush=True)
    median = {n: {t: statistics.median(v) for t, v in tools.items()} for n, tools in runs.items()}
    run.summary = {"what": "kernel start -> every rank's process group initialised, seconds", "median_s": median}
    for n, tools in median.items():
        print(f"{n} ranks: " + ", ".join(f"{t} {s:.2f} s" for t, s in tools.items()))
        if "jupyter-distributed" in tools and "workbench" in tools:
            run.target(
                f"start-up x{n} workbench / jupyter-distributed",
                tools["workbench"] / tools["jupyter-distributed"],
                "<=",
                1.0,
            )
        if "workbench-ray" in tools and "workbench" in tools:
            run.summary.setdefault("ray_over_local", {})[n] = tools["workbench-ray"] / tools["workbench"]
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
