"""The workbench's own background threads give way to training.

Where ranks share the cores with the workbench's helpers (a laptop, a 2-core lab machine), a
helper that wakes while every core trains takes its slice from a rank, and under data
parallelism every rank then waits for the slowed one. So the notebook's helper threads and the
controller's processes run at nice +10: they still get every idle moment, and a rank that wakes
takes the core back. Which threads, and why not ``SCHED_IDLE``: docs/architecture.md.
"""

from __future__ import annotations

import os
import threading

NICE = 10


def lower_this_thread(nice: int = NICE) -> bool:
    """Lower the calling thread's CPU priority to ``nice`` (never raises it); True if done.

    Only the calling thread: a kernel's main thread, a rank's training thread keep theirs.
    """
    if not hasattr(os, "setpriority"):
        return False
    tid = threading.get_native_id()
    try:
        if os.getpriority(os.PRIO_PROCESS, tid) >= nice:
            return True
        os.setpriority(os.PRIO_PROCESS, tid, nice)
        return True
    except OSError:  # not allowed here (a container's seccomp policy): run as is
        return False


def lower_processes(pids, nice: int = NICE) -> int:
    """Lower every thread of the processes ``pids`` (this user's own) to ``nice``; threads
    they start later inherit it. Returns how many threads were lowered."""
    if not hasattr(os, "setpriority"):
        return 0
    done = 0
    for pid in pids:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            tids = [pid]  # no /proc: the main thread (all threads where nice is per process)
        for tid in tids:
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) < nice:
                    os.setpriority(os.PRIO_PROCESS, tid, nice)
                done += 1
            except OSError:  # gone meanwhile, or not allowed: left as it is
                pass
    return done


def thread_nice(thread: threading.Thread) -> int | None:
    """The nice value of a running thread (None where it cannot be read)."""
    if not hasattr(os, "getpriority") or thread.native_id is None:
        return None
    try:
        return os.getpriority(os.PRIO_PROCESS, thread.native_id)
    except OSError:
        return None
