"""The workbench's own background threads give way to training.

On a machine with a core to spare per rank this changes nothing. Where ranks share the
cores with the workbench's helpers (a laptop, a 2-core lab machine with two busy ranks),
a helper that wakes while both cores train takes its slice from a rank, and under data
parallelism every rank then waits for the slowed one. Measured on 2 cores while a run
streamed: the notebook's collector and dashboard redraw used ~4.5% of a core (now ~1.5%:
the redraw restyles raw arrays, see ``dashboard.figures.draw``), the ipyparallel
controller ~0.4%. So a notebook-side helper
thread runs at a lower CPU priority (nice +10 for that thread only: on Linux the nice
value is per thread): it still gets every idle moment (the ranks wait in collectives
part of each step), but a rank that wakes takes the core back. The controller's
processes are lowered too once the ranks are up: they route the notebook's cells and
the ranks' heartbeats (every 300 ms), and at nice +10 a cell still reaches busy ranks
within milliseconds.

Only threads that share no GIL with training are lowered: a rank's event sender keeps
the rank's priority. A lowered thread that is preempted while it holds the GIL (the
sender encodes its batch under it) would make the training thread wait until the
scheduler runs the lowered thread again (a priority inversion).

Not ``SCHED_IDLE``: a helper must not starve when the ranks keep every core busy (the
event queue would fill, the plots would freeze).
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
