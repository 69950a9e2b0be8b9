"""Start-up: from a new notebook kernel to ranks with an initialised process group.

Targets: from a new kernel no slower than jupyter-distributed at 2 and 4 ranks; ``%distrain
start -n 4`` ready <= 2.5 s a moment after ``%load_ext`` (the method: docs/figures.md).
Results: ``benchmarks/results/startup-*.json`` (``--pool``: every saved run); exit 1 on a miss.
Set up jupyter-distributed once, in a venv of its own that takes torch from ours, then run::

    python3 -m venv .state/jd/venv && .state/jd/venv/bin/pip install jupyter-distributed
    echo $PWD/.venv/lib/python3.11/site-packages > .state/jd/venv/lib/python3.11/site-packages/zz_shared_torch.pth
    OMP_NUM_THREADS=1 python benchmarks/startup_bench.py --sizes 2 4 --rounds 3  # [--tools workbench workbench-ray]"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import sys
import time

import psutil

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


def run_cell(kc, code, timeout=300, expressions=None):
    msg_id = kc.execute(code, user_expressions=expressions or {})
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            if reply["content"]["status"] != "ok":
                raise RuntimeError(f"cell failed: {reply['content'].get('evalue')}")
            return {k: v.get("data", {}).get("text/plain") for k, v in reply["content"]["user_expressions"].items()}


RUN_TIMEOUT_S = 120  # a start that takes longer failed (a run is tried twice; see _measure)
MOMENT_S = 3.0  # between `%load_ext workbench` and `%distrain start` (workbench-loaded)
STANDBY_PID = "__import__('workbench.notebook.cluster.standby').notebook.cluster.standby.current().pid"


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
        if tool == "workbench-loaded":
            code = f"%distrain start -n {n} --backend gloo"
        if tool == "workbench-ray":
            code = f"%load_ext workbench\n%distrain start -n {n} --backend gloo --launcher ray --address {RAY_HEAD}"
    t0 = time.perf_counter()
    km.start_kernel(env=env, cwd=str(STATE))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        if tool == "workbench-loaded":
            run_cell(kc, "%load_ext workbench")
            time.sleep(MOMENT)
            t0 = time.perf_counter()
        run_cell(kc, code, timeout=RUN_TIMEOUT_S)
        elapsed = time.perf_counter() - t0
        if tool == "workbench-loaded":
            preloaded = run_cell(kc, "", expressions={"p": "__import__('workbench').current().preloaded"})["p"]
            assert preloaded == "True", "the start did not use the standby"
        if tool in ("workbench", "workbench-ray", "workbench-loaded"):
            run_cell(kc, "import workbench; workbench.stop()")
        elif tool == "ipyparallel":
            run_cell(kc, "rc.close(); cluster.stop_cluster_sync()")
    finally:
        kc.stop_channels()
        kernel = psutil.Process(km.provisioner.process.pid)
        tree = [kernel, *kernel.children(recursive=True)]
        km.shutdown_kernel(now=False)
        _, left = psutil.wait_procs(tree, timeout=30)  # the next run starts on a machine this one has left
        for proc in left:  # a kernel group stuck in a failed run: its processes, by pid
            try:
                proc.kill()
            except psutil.Error:
                pass
        time.sleep(1.0)
    return elapsed


def standby_idle(seconds: float) -> dict:
    """What a standby costs while no start comes: its memory once torch is imported, and the
    CPU it uses over ``seconds`` after that (it blocks reading its stdin)."""
    from jupyter_client import KernelManager

    km = KernelManager(kernel_name="python3")
    km.start_kernel(env={**os.environ, "IPYTHONDIR": str(STATE / "ipython")}, cwd=str(STATE))
    kc = km.client()
    kc.start_channels()
    try:
        kc.wait_for_ready(timeout=120)
        t0 = time.perf_counter()
        pid = int(run_cell(kc, "%load_ext workbench", expressions={"pid": STANDBY_PID})["pid"])
        proc = psutil.Process(pid)
        last = -1.0
        while True:  # imported: its CPU time stops growing
            time.sleep(0.5)
            cpu = sum(proc.cpu_times()[:2])
            if cpu == last:
                break
            last = cpu
        ready_s = time.perf_counter() - t0
        mem = proc.memory_full_info()
        time.sleep(seconds)
        idle_cpu = sum(proc.cpu_times()[:2]) - last
        return {
            "import_cpu_s": round(last, 3),
            "imported_within_s": round(ready_s, 2),
            "rss_mb": round(mem.rss / 2**20, 1),
            "uss_mb": round(mem.uss / 2**20, 1),
            "pss_mb": round(mem.pss / 2**20, 1),
            "threads": proc.num_threads(),
            "idle_window_s": seconds,
            "idle_cpu_s": round(idle_cpu, 4),
        }
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=False)


MOMENT = MOMENT_S
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
    parser.add_argument(
        "--tools", nargs="+", default=["workbench", "workbench-loaded", "ipyparallel", "jupyter-distributed"]
    )
    parser.add_argument("--pool", action="store_true", help="report every saved run; run nothing")
    parser.add_argument("--moment", type=float, default=MOMENT_S, help="workbench-loaded: seconds between the cells")
    parser.add_argument("--idle", type=float, default=0.0, help="measure an unused standby over this many seconds")
    args = parser.parse_args(argv)
    global MOMENT
    MOMENT = args.moment
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
                failed = []
                for _attempt in range(2):
                    try:
                        s = one(tool, n)
                        break
                    except Exception as exc:  # e.g. a rendezvous port taken meanwhile: recorded, tried again
                        failed.append(f"{type(exc).__name__}: {exc}"[:300])
                        print(f"round {r + 1}, {n} ranks, {tool}: failed ({failed[-1]}), trying again", flush=True)
                else:
                    raise RuntimeError(f"{tool} x{n} failed twice: {failed}")
                runs[str(n)][tool].append(s)
                load = [round(x, 2) for x in os.getloadavg()]
                row = {"round": r, "ranks": n, "tool": tool, "seconds": s, "load_avg_1_5_15": load}
                run.rounds.append({**row, "failed_attempts": failed} if failed else row)
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
        if "workbench-loaded" in tools and n == "4":
            run.target("start-up x4 after %load_ext, seconds", tools["workbench-loaded"], "<=", 2.5)
        if "workbench-ray" in tools and "workbench" in tools:
            run.summary.setdefault("ray_over_local", {})[n] = tools["workbench-ray"] / tools["workbench"]
    if args.idle:
        run.summary["standby_idle"] = idle = standby_idle(args.idle)
        print("unused standby: " + ", ".join(f"{k} {v}" for k, v in idle.items()))
    return run.finish()


if __name__ == "__main__":
    raise SystemExit(main())
