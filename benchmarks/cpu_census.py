"""Where the CPU goes during a stretch of training steps, thread by thread.

Wall-clock ratios on a shared 2-core machine move with the neighbours' load; CPU time spent
does not (much), and with 4 ranks on 2 cores every CPU-ms outside the training threads is
taken from a step. Linux only (``/proc/<pid>/task/<tid>/schedstat`` and ``status``);
standard library only, since it is imported on the ranks and in the ``torchrun`` workers."""

from __future__ import annotations

import os


def _thread(pid: int, tid: int) -> dict | None:
    base = f"/proc/{pid}/task/{tid}"
    try:
        with open(f"{base}/schedstat") as f:
            cpu_ns, wait_ns, _ = (int(x) for x in f.read().split())
        with open(f"{base}/comm") as f:
            comm = f.read().strip()
        vol = nonvol = 0
        with open(f"{base}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches"):
                    vol = int(line.split()[1])
                elif line.startswith("nonvoluntary_ctxt_switches"):
                    nonvol = int(line.split()[1])
    except (OSError, ValueError):
        return None  # ended meanwhile
    return {"comm": comm, "cpu_ns": cpu_ns, "wait_ns": wait_ns, "vol": vol, "nonvol": nonvol}


def children(pid: int) -> list[int]:
    """Every descendant of ``pid`` alive now (from ``/proc/*/stat``'s parent field)."""
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
            parents[int(entry)] = int(stat[stat.rindex(")") + 2 :].split()[1])
        except (OSError, ValueError):
            continue
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parents.items() if pp == p]
        out.extend(kids)
        todo.extend(kids)
    return sorted(out)


def snapshot(roles: dict[str, int]) -> dict:
    """``{role: {pid: {tid: counters}}}`` for each role's process (``role`` -> pid)."""
    out: dict = {}
    for role, pid in roles.items():
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        got = {tid: _thread(pid, tid) for tid in tids}
        out[role] = {pid: {tid: c for tid, c in got.items() if c is not None}}
    return out


def delta(before: dict, after: dict, names: dict[int, str] | None = None) -> list[dict]:
    """One row per thread seen in ``after``: role, thread name (``names``: tid -> the Python
    thread's name, else the kernel's comm), CPU ms, ms waiting for a CPU, wake-ups
    (voluntary switches) and preemptions (involuntary) during the window."""
    names = names or {}
    rows = []
    for role, procs in after.items():
        for pid, threads in procs.items():
            old = before.get(role, {}).get(pid, {})
            for tid, c in threads.items():
                o = old.get(tid, {"cpu_ns": 0, "wait_ns": 0, "vol": 0, "nonvol": 0})
                rows.append(
                    {
                        "role": role,
                        "pid": pid,
                        "tid": tid,
                        "thread": names.get(tid, c["comm"]),
                        "cpu_ms": (c["cpu_ns"] - o["cpu_ns"]) / 1e6,
                        "wait_ms": (c["wait_ns"] - o["wait_ns"]) / 1e6,
                        "wakeups": c["vol"] - o["vol"],
                        "preempted": c["nonvol"] - o["nonvol"],
                    }
                )
    return rows


def python_thread_names() -> dict[int, str]:
    """tid -> name of this process's Python threads (Python 3.11 does not name OS threads)."""
    import threading

    return {t.native_id: t.name for t in threading.enumerate() if t.native_id is not None}
