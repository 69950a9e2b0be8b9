"""Watching rank processes: who is alive, who died and how, who is stuck where.

Ranks on this host (local and MPI launchers) are watched by pid (:class:`Watcher`): a death is
known at once and a run costs no wake-ups. Ranks on other hosts are watched through
ipyparallel's heartbeat (``launchers.heartbeat_args``), or, where a guard runs them (SSH, Slurm,
Ray), by the guard: its exit report, and its beats, whose silence names the whole host lost
(``lifeline.HOST_SILENCE_S``).
"""

from __future__ import annotations

import os
import select
import signal
import socket
import threading
import time

import psutil

# a guarded rank that the controller dropped (its nanny told it) waits this long for its guard's
# report, which says how it ended, before it is named dead without one (RankSet.dead)
GUARD_REPORT_S = 1.0


def describe_exit(code: int | None) -> str:
    """'killed by SIGKILL' / 'exited with code 3' / 'exited (status unknown)'."""
    if code is None:
        return "exited (status unknown)"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


class RankProcess:
    """One rank's process as seen from the notebook (only when on this host)."""

    def __init__(self, rank: int, host: str, pid: int, launcher_proc=None, exit_dir: str | None = None):
        self.rank = rank
        self.host = host
        self.pid = pid
        self.local = host == socket.gethostname()
        self._launcher_proc = launcher_proc  # psutil.Process held by ipyparallel's launcher
        # ranks forked by ``workbench.engine.preload``: their parent writes the status here
        self._exit_file = os.path.join(exit_dir, str(pid)) if exit_dir else None
        self._proc = None
        if self.local:
            try:
                self._proc = launcher_proc or psutil.Process(pid)
            except psutil.NoSuchProcess:
                self._proc = None

    def alive(self) -> bool:
        if not self.local:
            return True
        if self._proc is None:
            return False
        try:
            return self._proc.is_running() and self._proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def state(self) -> str:
        """psutil's state: running, sleeping, stopped (SIGSTOP), zombie, dead."""
        if not self.local:
            return "remote"
        try:
            return self._proc.status() if self._proc else "dead"
        except psutil.NoSuchProcess:
            return "dead"

    def exit_code(self, patience: float = 1.0) -> int | None:
        """The exit status, or None where it cannot be known (not our child).

        ipyparallel's launcher thread reaps its engines and caches the status on the
        same psutil object; give it ``patience`` seconds to do so before reaping here.
        """
        proc = self._launcher_proc or self._proc
        if proc is None and self._exit_file is None:
            return None
        deadline = time.monotonic() + patience
        while True:
            if self._exit_file is not None:
                try:
                    with open(self._exit_file) as f:
                        return int(f.read())
                except (OSError, ValueError):
                    if time.monotonic() >= deadline:
                        return None
                    time.sleep(0.02)
                    continue
            code = getattr(proc, "_exitcode", None)
            if isinstance(code, int):
                return int(code)
            if self._launcher_proc is not None:
                # never reap here: a wait racing the launcher's thread gets ECHILD, and psutil
                # then caches None on the shared object over the launcher's real status
                if time.monotonic() >= deadline:
                    return None
                time.sleep(0.02)
                continue
            try:
                code = proc.wait(timeout=0.05)
                if code is not None:
                    return code
            except psutil.TimeoutExpired:
                pass
            except (psutil.NoSuchProcess, ChildProcessError, OSError):
                pass
            if time.monotonic() >= deadline:
                return None
            time.sleep(0.05)

    def rss(self) -> int | None:
        if not self.local or self._proc is None:
            return None
        try:
            return int(self._proc.memory_info().rss)
        except psutil.Error:
            return None


class Watcher:
    """Watches rank processes and records the first death of each rank.

    On Linux its thread sleeps on a pidfd per local rank, which the kernel makes readable the
    moment the process ends; elsewhere it polls every ``period`` seconds."""

    def __init__(self, procs: list[RankProcess], period: float = 0.25):
        self.procs = procs
        self.period = period
        self.deaths: dict[int, dict] = {}
        self.causes: dict[int, tuple[str, str]] = {}  # rank -> (cause, note) the launcher knows (add_cause)
        self.listeners: list = []  # fn(death) called on the watcher's thread at each first death
        self.by_pidfd = False  # the thread sleeps on every local rank's pidfd: it records deaths at once
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="workbench-rank-watcher", daemon=True)
        self._thread.start()

    CHECK_EVERY_S = 1.0  # with pidfds: how often the thread still looks for close()

    def _run(self) -> None:
        from ..background import lower_this_thread

        lower_this_thread()  # gives way to ranks training on the same cores
        fds = self._pidfds()
        if fds is None:
            while not self._stop.wait(self.period):
                self.poll()
            return
        self.by_pidfd = True
        self.poll()  # ranks that had ended before their pidfd could be opened
        try:
            while not self._stop.is_set():
                ready, _, _ = select.select(list(fds), [], [], self.CHECK_EVERY_S)
                if not ready:  # no rank ended: nothing to read (no psutil reads of every rank)
                    continue
                self.poll()
                for fd in ready:  # an ended process's pidfd stays readable: done with it
                    if fds[fd].rank in self.deaths:
                        del fds[fd]
                        os.close(fd)
                    else:  # ended but not yet seen as dead (being reaped): look again shortly
                        self._stop.wait(self.period)
        finally:
            self.by_pidfd = False
            for fd in fds:
                os.close(fd)

    def _pidfds(self) -> dict | None:
        """fd -> rank process for every live local rank; None where pidfds are not available."""
        if not hasattr(os, "pidfd_open"):
            return None
        fds: dict = {}
        for p in self.procs:
            if not p.local:
                continue
            try:
                fds[os.pidfd_open(p.pid)] = p
            except ProcessLookupError:  # already gone: the first poll records it
                continue
            except OSError:  # no pidfd support in this kernel or sandbox
                for fd in fds:
                    os.close(fd)
                return None
        return fds

    def known(self) -> dict[int, dict]:
        """The deaths known now. Where the thread sleeps on pidfds it has recorded them
        already: no /proc reads per call (a call in flight asks ten times a second, on
        cores the ranks train on); elsewhere every rank is checked now."""
        if self.by_pidfd:
            return dict(self.deaths)
        return self.poll()

    def poll(self) -> dict[int, dict]:
        """Check every rank now; return the deaths known so far."""
        for p in self.procs:
            if p.rank in self.deaths or p.alive():
                continue
            with self._lock:
                if p.rank not in self.deaths:
                    code = p.exit_code()
                    self.deaths[p.rank] = {
                        "rank": p.rank,
                        "host": p.host,
                        "pid": p.pid,
                        "exit_code": code,
                        "exit": self._noted(p.rank, describe_exit(code)),
                        "time": time.time(),
                    }
                    self._tell(self.deaths[p.rank])
        return dict(self.deaths)

    def _tell(self, death: dict) -> None:
        for fn in list(self.listeners):
            try:
                fn(death)
            except Exception:  # a listener (the Lab registry) must never break the watching
                pass

    def mark_dead(self, rank: int, reason: str, exit_code: int | None = None, *, host_lost: bool = False) -> None:
        """Record a death reported from outside: the controller (a heartbeat stopped), the
        rank's guard (with the exit status, which replaces a death seen without one) or the
        lifeline (``host_lost``: its host fell silent; a later exit keeps that mark)."""
        with self._lock:
            known = self.deaths.get(rank)
            if known is None or (known["exit_code"] is None and exit_code is not None and not known.get("host_lost")):
                p = self.procs[rank]
                self.deaths[rank] = {
                    "rank": rank,
                    "host": p.host,
                    "pid": p.pid,
                    "exit_code": exit_code,
                    "exit": self._noted(rank, reason),
                    "time": known["time"] if known else time.time(),
                    **({"host_lost": True} if host_lost else {}),
                }
                self._tell(self.deaths[rank])

    def add_cause(self, rank: int, cause: str, note: str) -> None:
        """Add what the launcher knows (Ray's actor death cause) to a death recorded without it."""
        with self._lock:
            self.causes[rank] = (cause, note)
            death = self.deaths.get(rank)
            if death is not None:
                death["exit"] = self._noted(rank, death["exit"])

    def _noted(self, rank: int, text: str) -> str:
        cause, note = self.causes.get(rank, ("", ""))
        return text if not cause or cause in text else f"{text} ({note})"

    def close(self) -> None:
        self._stop.set()


def death_message(deaths: list[dict]) -> str:
    """One line per dead rank, and what to do."""
    lines = [f"rank {d['rank']} (host {d['host']}, pid {d['pid']}) {d['exit']}" for d in deaths]
    return "; ".join(lines) + ". Run `%distrain restart` to bring the rank set back."


def process_tree(pids: list[int]) -> list[int]:
    """The given pids and all their descendants that are alive now."""
    out: list[int] = []
    for pid in pids:
        if not pid or pid <= 0:
            continue
        try:
            proc = psutil.Process(pid)
        except psutil.NoSuchProcess:
            continue
        out.append(pid)
        try:
            out.extend(c.pid for c in proc.children(recursive=True))
        except psutil.NoSuchProcess:
            pass
    return sorted(set(out))


def session_of(pid: int) -> tuple[int, float] | None:
    """(pid, start time) of a process that leads its own session, else None."""
    try:
        if os.getsid(pid) != pid:
            return None
        return pid, psutil.Process(pid).create_time()
    except (OSError, psutil.Error):
        return None


def session_pids(leader: int, created: float) -> list[int]:
    """The live processes of the session that ``leader`` (started at ``created``) made.

    A session id outlives its leader while any member lives, and the kernel does not
    give the id to a new process meanwhile: a live process with the leader's pid but
    another start time means the session is gone, not that these are its members.
    """
    try:
        if psutil.Process(leader).create_time() != created:
            return []
    except psutil.NoSuchProcess:
        pass
    out = []
    for pid in psutil.pids():
        try:
            if os.getsid(pid) == leader:
                out.append(pid)
        except OSError:
            continue
    return out


def end_pids(pids: list[int], grace: float = 3.0) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace`` seconds, exactly these pids.

    Returns the pids still alive afterwards (should be none). Ends processes by pid
    only: never by name, so other users' and other notebooks' ranks are safe.
    """
    procs = []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            procs.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            pass
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(alive, timeout=grace)
    return [p.pid for p in alive if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
