"""The controller's process: ipyparallel's controller, which ends when its notebook does.

ipyparallel starts the controller in a session of its own, so a killed kernel would leave it
running: it ends with its owner (:func:`_end_when_orphaned`), its children end with it
(:func:`children_end_with_it`), and it paces the heartbeat (:func:`settling_heartbeat`).
Run by path (``runpy.run_path``), not as ``-m workbench...``: it imports nothing of the
workbench (standard library and psutil only), so it starts as fast as ipyparallel's own.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time

POLL_S = 0.5
HEARTBEAT_FLAG = "--workbench-heartbeat="
OWNER_FLAG = "--workbench-owner="  # a file that may name the process it ends with instead (detach)


def _gone(pid: int) -> bool:
    """``pid`` has exited (no such process, or a zombie not yet reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def _wait_for_exit(pid: int) -> None:
    try:  # sleep until it exits (its pidfd turns readable), not woken by a timer
        fd = os.pidfd_open(pid)
    except (AttributeError, OSError):  # no pidfds here, or it is gone already
        fd = None
    if fd is not None:
        import select

        select.select([fd], [], [])
        os.close(fd)
    while not _gone(pid):
        time.sleep(POLL_S)


def _next_owner(owner_file: str | None, was: int) -> int | None:
    """The process named in the owner file (a set handed to a keeper, ``%distrain detach``),
    when it is another one and alive; else None: the controller ends."""
    if not owner_file:
        return None
    try:
        with open(owner_file) as f:
            pid = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return None
    return pid if pid != was and not _gone(pid) else None


def _end_when_orphaned(parent: int, owner_file: str | None = None) -> None:
    """Once the owner is gone, end this process's group (itself and its schedulers, nothing else:
    it leads that group).

    A killed kernel (SIGKILL, out of memory) does not take the controller along. Ranks on the
    notebook's host end it then (rank 0 watches the notebook), but Slurm and SSH ranks run
    elsewhere and their guards end them first: the controller and its schedulers would live on.
    The owner is the notebook (``parent``), or the keeper a set was handed to (``%distrain
    detach``), named in ``owner_file`` (``--workbench-owner=PATH``)."""
    owner = parent
    while True:
        _wait_for_exit(owner)
        if owner == parent:
            while os.getppid() == parent:  # reparented once the parent has exited
                time.sleep(POLL_S)
        nxt = _next_owner(owner_file, owner)
        if nxt is None:
            break
        owner = nxt
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)  # the group this process leads: it and its schedulers
    import psutil  # not a group leader (started some other way): its children by pid, then itself

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    os._exit(1)


def _end_with(pid: int) -> None:
    _wait_for_exit(pid)
    os.kill(os.getpid(), signal.SIGKILL)


class EndsWithController(multiprocessing.Process):
    """ipyparallel's ``Process`` for the controller's children: each runs a daemon thread that
    sleeps on the controller's pidfd and ends the child once the controller has exited."""

    def start(self) -> None:
        self._controller = os.getpid()  # in the controller, before the fork
        super().start()

    def run(self) -> None:
        threading.Thread(target=_end_with, args=(self._controller,), name="controller-watch", daemon=True).start()
        try:
            super().run()
        except Exception as exc:
            # a part that cannot run (its port taken between the controller's choice and its
            # bind) leaves a controller that admits no engine: end it, so that a start sees it
            print(f"{PART_FAILED} {_part_name(self)}: {type(exc).__name__}: {exc}", file=sys.stderr, flush=True)
            try:
                os.kill(self._controller, signal.SIGKILL)
            except ProcessLookupError:
                pass
            raise


PART_FAILED = "workbench: the controller's part failed:"  # read by the notebook (cluster/controller_watch.py)


def _part_name(proc: multiprocessing.Process) -> str:
    """What the part runs: ipyparallel's heart monitor or a scheduler (a function), or a ZMQ
    queue (a device's bound ``run``)."""
    target = getattr(proc, "_target", None)
    owner = getattr(target, "__self__", None)
    return type(owner).__name__ if owner is not None else getattr(target, "__name__", type(proc).__name__)


def children_end_with_it() -> None:
    """Patched in before the controller forks: every child it starts is an :class:`EndsWithController`:
    ``app.Process`` (heart monitor, task and broadcast schedulers) and pyzmq's ``ProcessDevice``
    launcher (the mux, control and iopub queues). A controller killed from outside (SIGKILL: no
    clean-up) would otherwise leave them to init."""
    from ipyparallel.controller import app
    from zmq.devices.basedevice import ProcessDevice

    app.Process = ProcessDevice._launch_class = EndsWithController


def settling_heartbeat(fast_ms: int, hearts: int) -> None:
    """Beat every ``fast_ms`` until ``hearts`` engines beat, then at ``HeartMonitor.period``
    (``--workbench-heartbeat=FAST_MS,HEARTS``).

    Fast while the ranks register: the controller admits an engine on its next beat. Each beat
    wakes the heart monitor, every rank's heart thread and ZMQ's threads on both sides (their
    cost: benchmarks/FINDINGS.md, the rank census); once the ranks are in, nothing waits on a
    beat. An engine lost or late (on probation) brings the fast beat back until all beat again.
    The allowed silence stays the configured ``period * max_heartmonitor_misses`` seconds at
    either pace. Patched on the class before the controller forks its heart monitor process,
    which inherits it.
    """
    from ipyparallel.controller.heartmonitor import HeartMonitor

    start, beat = HeartMonitor.start, HeartMonitor.beat

    def pace(self, period: int) -> None:
        self.period = period
        self.max_heartmonitor_misses = max(1, self._silence_ms // period)
        caller = getattr(self, "caller", None)
        if caller is not None:
            caller.callback_time = period  # read by tornado when it schedules the next call

    def start_fast(self) -> None:
        self._settled_ms = self.period
        self._silence_ms = self.period * self.max_heartmonitor_misses
        pace(self, min(fast_ms, self._settled_ms))
        start(self)

    def beat_then_pace(self) -> None:
        beat(self)
        settled = len(self.hearts) >= hearts and not self.on_probation
        want = self._settled_ms if settled else min(fast_ms, self._settled_ms)
        if want != self.period:
            pace(self, want)

    HeartMonitor.start, HeartMonitor.beat = start_fast, beat_then_pace


COALESCED = "_workbench_coalesced"  # the first reply of a merged coalesced reply (cluster/fanout.py)


def merge_replies(parts: list[list], *, merged: bool) -> list:
    """One coalesced reply's buffers from its parts (each an engine's reply buffers, or with
    ``merged`` a merged reply of a scheduler below), each distinct reply once: a header ``{COALESCED: 1, "index":
    [which distinct reply, per target in order], "sizes": [buffers of each distinct reply]}``
    serialised as ipyparallel serialises a result, then the distinct replies' buffers."""
    from ipyparallel.serialize import deserialize_object, serialize_object

    distinct: dict[tuple, int] = {}
    units: list[list] = []
    index: list[int] = []

    def add(unit: list) -> int:
        key = tuple(bytes(getattr(b, "bytes", b)) for b in unit)
        if key not in distinct:
            distinct[key] = len(units)
            units.append(unit)
        return distinct[key]

    for part in parts:
        if merged:  # split it again
            head = deserialize_object([part[0]])[0]
            rest, local = part[1:], []
            for size in head["sizes"]:
                local.append(add(rest[:size]))
                rest = rest[size:]
            index.extend(local[i] for i in head["index"])
        else:  # one engine's reply
            index.append(add(part))
    head = serialize_object({COALESCED: 1, "index": index, "sizes": [len(u) for u in units]})
    return head + [b for unit in units for b in unit]


def aggregating_coalescence() -> None:
    """Replies that the broadcast tree coalesces are merged by content on the way up: each
    scheduler sends each distinct reply once with an index, so that a quiet cell on 1024 ranks
    reaches the notebook as one reply to unpack, not 1024. Patched on the class before the
    controller forks its schedulers, which inherit it.

    A scheduler above another one takes the order of the targets from that one's reply (it
    answers leaf by leaf): its own target list is in the client's order, which at a depth of 2
    or more is not the order of the replies it merges. Each call counts the replies it still
    awaits: looking through all of them on every reply would cost a leaf of k ranks k * k / 2 steps."""
    from ipyparallel.controller.broadcast_scheduler import BroadcastScheduler

    awaited: dict[tuple[int, str], int] = {}  # (scheduler, call): replies not yet in

    def coalescing_reply(self, raw_msg, msg, original_msg_id, outgoing_id, idents):
        pending = self.accumulated_replies[original_msg_id]
        key = (id(self), original_msg_id)
        if key not in awaited:
            awaited[key] = len(pending)
        if pending.get(outgoing_id) is None:
            awaited[key] -= 1
        if self.is_leaf:
            pending[outgoing_id] = msg["buffers"]
        else:  # a merged reply, in the order its scheduler answers in
            pending[outgoing_id] = (msg["buffers"], msg["metadata"]["broadcast_targets"])
        if awaited[key] > 0:
            return
        del awaited[key]
        replies = self.accumulated_replies.pop(original_msg_id)
        targets = self.accumulated_targets.pop(original_msg_id)
        new_msg = msg.copy()
        if self.is_leaf:  # the replies in the order of the targets (their slots were made so)
            order, parts = targets, list(replies.values())
        else:
            order, parts = [], []
            for sub, (buffers, below) in replies.items():
                mine = {t[0]: t for t in targets[sub]}
                order.extend(mine[t if isinstance(t, str) else t[0]] for t in below)  # a leaf names idents
                parts.append(buffers)
        new_msg["metadata"]["broadcast_targets"] = order
        buffers = merge_replies(parts, merged=not self.is_leaf)
        self.client_stream.send_multipart(idents + self.session.serialize(new_msg) + buffers, copy=False)

    BroadcastScheduler.coalescing_reply = coalescing_reply


def open_files_to_hard_limit() -> None:
    """Raise this process's descriptor limit to its hard limit.

    The controller holds ~8 TCP connections per engine (shell, task, broadcast, control,
    iopub, registration, two for the heart): the soft limit many systems start a process with,
    1,024, stops a set at ~120 ranks with "Too many open files". Its schedulers, forked after
    this, inherit it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # an unlimited hard limit the kernel caps (nr_open)
            pass


def main() -> None:
    open_files_to_hard_limit()
    owner_file = None
    for arg in [a for a in sys.argv[1:] if a.startswith(OWNER_FLAG)]:
        sys.argv.remove(arg)
        owner_file = arg[len(OWNER_FLAG) :]
    threading.Thread(
        target=_end_when_orphaned, args=(os.getppid(), owner_file), name="owner-watch", daemon=True
    ).start()
    aggregating_coalescence()
    children_end_with_it()
    for arg in [a for a in sys.argv[1:] if a.startswith(HEARTBEAT_FLAG)]:
        sys.argv.remove(arg)
        fast_ms, hearts = (int(x) for x in arg[len(HEARTBEAT_FLAG) :].split(","))
        settling_heartbeat(fast_ms, hearts)
    from ipyparallel.controller.app import main as controller

    controller()


if __name__ == "__main__":
    main()
