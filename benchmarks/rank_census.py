"""Which threads beside the training wake, and how much CPU they use, on live ranks.

Starts N ranks (default 4), then counts every thread of the ranks, the controller (its heart
monitor and schedulers), the ranks' parent and this process (the notebook's side) for SECONDS
while the ranks are idle and while they compute: CPU ms per second, wake-ups and preemptions
per second (`cpu_census`). Run: `OMP_NUM_THREADS=1 .venv/bin/python benchmarks/rank_census.py [N] [SECONDS]`.
Saved as ``benchmarks/results/rank_census-*.json`` (rows per phase, role and thread; no target).
"""

import pathlib
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]
import cpu_census  # noqa: E402
import results  # noqa: E402
import strategy_bench  # noqa: E402

import workbench  # noqa: E402

n = int(sys.argv[1]) if len(sys.argv) > 1 else 4
secs = float(sys.argv[2]) if len(sys.argv) > 2 else 6.0
run = results.Run("rank_census", {"ranks": n, "seconds": secs})
t0 = time.perf_counter()
rs = workbench.start(n, backend="gloo", threads=1, sys_path=(str(HERE),))
print(f"start {time.perf_counter() - t0:.2f} s")
try:
    roles = strategy_bench.workbench_roles(rs)
    for r, p in enumerate(rs.procs):
        roles[f"rank{r}"] = p.pid
    names = cpu_census.python_thread_names()  # tid -> Python thread name: here and on every rank
    for got in rs.apply(cpu_census.python_thread_names):
        names.update(got)

    def show(title, rows, window):
        print(f"--- {title} ({window:.1f} s)")
        agg = {}
        for row in rows:
            role = row["role"].split(":")[0]
            if role.startswith("rank"):
                role = "rank"
            key = (role, row["thread"])
            a = agg.setdefault(key, [0.0, 0, 0, 0])
            a[0] += row["cpu_ms"]
            a[1] += row["wakeups"]
            a[2] += row["preempted"]
            a[3] += 1
        for (role, th), (ms, w, pre, k) in sorted(agg.items(), key=lambda kv: -kv[1][0]):
            print(
                f"  {role:>16} {th:<32} x{k} {ms / window:8.2f} ms/s {w / window:8.1f} wake/s {pre / window:6.1f} pre/s"
            )
            run.rounds.append(
                {
                    "phase": title,
                    "role": role,
                    "thread": th,
                    "threads": k,
                    "cpu_ms_per_s": ms / window,
                    "wakeups_per_s": w / window,
                    "preempted_per_s": pre / window,
                }
            )

    time.sleep(2)
    b = cpu_census.snapshot(roles)
    time.sleep(secs)
    a = cpu_census.snapshot(roles)
    show("idle", cpu_census.delta(b, a, names), secs)
    code = f"""
import time, torch
_x = torch.randn(256, 256)
_t = time.perf_counter()
while time.perf_counter() - _t < {secs + 2}:
    _x = (_x @ _x).tanh_()
"""
    call = rs.execute_async(code)
    time.sleep(1)
    b = cpu_census.snapshot(roles)
    time.sleep(secs)
    a = cpu_census.snapshot(roles)
    call.wait(30)
    show("busy", cpu_census.delta(b, a, names), secs)
finally:
    workbench.stop()
run.finish()
