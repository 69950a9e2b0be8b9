"""A hung training step, found and explained (``train start --step-timeout S``).

When no step has arrived for ``timeout`` seconds while every rank runs, every rank's Python
stacks are read (faulthandler, answered even inside C) and each rank is said to wait in a
collective or to be stuck elsewhere, holding the others up. Nothing is killed or paused: the
run that owns the watchdog decides (a trainer run reports it, a failure budget recovers)."""

from __future__ import annotations

import sys
import threading
import time

from ..cluster import culprit
from ..cluster.diagnosis import collect_stacks, stack_lines, thread_blocks
from .contract import ENDED

# frames of a training thread that waits for its peers: torch.distributed calls, the workbench's
# timing wrappers, the ranks' per-step agreement (shared memory or gloo), and backward (where
# DDP's reducer waits for gradients)
_COLLECTIVE = (
    "/torch/distributed/",
    "comm_timing.py",
    "agreement.py",
    "in _agree",
    "in all_reduce_mean",
    "in _average",
    "/torch/autograd/",
)
_TRAINER = "in _loop"


def trainer_frames(stack: str) -> list[str]:
    """The training thread's frames (innermost first) from a faulthandler dump; [] if none."""
    for block in thread_blocks(stack):
        if any(_TRAINER in f and "trainer.py" in f for f in block):
            return block
    return []


def classify(stack: str) -> tuple[str, list[str]]:
    """('collective' | 'stuck' | 'gone', the training thread's frames) for one rank."""
    frames = trainer_frames(stack)
    if not frames:
        return "gone", stack.splitlines()[:1]
    if any(k in f for f in frames for k in _COLLECTIVE):
        return "collective", frames
    return "stuck", frames


def report(
    run: str, timeout: float, idle_s: float, last: dict[int, int], stacks: dict[int, str], conclusion: str = ""
) -> dict:
    """The diagnosis as a dict (``stuck``, ``waiting``, ``where``, ``text``), led by
    ``conclusion`` (``cluster.culprit``: who waits in which collective, for whom)."""
    kinds = {r: classify(s) for r, s in stacks.items()}
    stuck = [r for r, (k, _) in kinds.items() if k != "collective"]
    waiting = [r for r, (k, _) in kinds.items() if k == "collective"]
    if not stuck:  # all in collectives: the laggards are the ones behind in steps
        low = min(last.values()) if last else 0
        stuck = [r for r in waiting if last.get(r, 0) == low and len(set(last.values())) > 1]
    where = {r: _where(f) for r, (_, f) in kinds.items()}
    steps = "last step per rank: " + ", ".join(f"{r}: {s}" for r, s in sorted(last.items()))
    head = f"training {run}: no step for {idle_s:.1f} s (step timeout {timeout:g} s)"
    if conclusion:  # the conclusion leads, on the line a recovery quotes
        lines = [f"{head}: {conclusion}", f"{steps}. Where each rank's training thread is:"]
    else:
        lines = [f"{head}; {steps}. Where each rank's training thread is:"]
    for r, (kind, _frames) in sorted(kinds.items()):
        label = {
            "collective": "waiting for the others in a collective",
            "stuck": "STUCK (not in a collective)",
            "gone": "no training thread",
        }[kind]
        lines.append(f"  [rank {r}] {label}: {where[r]}")
    for r in stuck:
        lines.extend(stack_lines(r, kinds[r][1][:12]))
    if stuck:
        lines.append(
            f"rank(s) {', '.join(map(str, stuck))} hold the run up; nothing was stopped "
            "(`%distrain train stop` ends the run once they return, `%distrain restart --load` "
            "starts over from the latest checkpoint)"
        )
    else:
        lines.append(
            "every rank waits in a collective: mismatched collectives or a lost peer; "
            "`%distrain where` shows every thread"
        )
    return {
        "run": run,
        "time": time.time(),
        "idle_s": idle_s,
        "stuck": stuck,
        "waiting": waiting,
        "where": where,
        "stacks": stacks,
        "conclusion": conclusion,
        "text": "\n".join(lines),
    }


_COMPREHENSIONS = ("in <listcomp>", "in <dictcomp>", "in <setcomp>", "in <genexpr>")


def _where(frames: list[str]) -> str:
    """The innermost frame, and the innermost one outside torch and the standard library
    (the user's or the workbench's code) when that is another."""
    # a comprehension is a frame of its own in Python 3.11: name the function that runs it
    frames = [f for f in frames if not f.endswith(_COMPREHENSIONS)] or frames
    if not frames:
        return "?"
    own = next((f for f in frames if "/torch/" not in f and not ("/lib/python3" in f and "-packages/" not in f)), None)
    return frames[0] if own in (None, frames[0]) else f"{frames[0]} <- {own}"


class StepWatchdog:
    """Watches ``run`` of ``rankset`` through ``store``; calls ``on_hang(report)`` once per stall."""

    def __init__(self, rankset, store, run: str, timeout: float, *, mark: int = 0, on_hang=None, poll: float = 0.25):
        if timeout <= 0:
            raise ValueError(f"step timeout must be positive, got {timeout}")
        self.rankset, self.store, self.run, self.timeout = rankset, store, run, float(timeout)
        self.mark, self.poll = mark, poll
        self.on_hang = on_hang or (lambda rep: print(rep["text"], file=sys.stdout, flush=True))
        self.reports: list[dict] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="workbench-step-watchdog", daemon=True)
        self._thread.start()

    def close(self) -> None:
        self._stop.set()

    def _loop(self) -> None:
        from ..background import lower_this_thread

        lower_this_thread()  # gives way to ranks training on the same cores
        last_seen, since, reported = None, time.monotonic(), False
        n = self.rankset.world_size
        while not self._stop.wait(self.poll):
            if not self.rankset.running:
                return
            states = self.store.run_state(self.run, self.mark)
            if len(states) == n and all(e["state"] in ENDED for e in states.values()):
                return
            steps = self.store.last_steps(self.run)
            key = (tuple(sorted(steps.items())), tuple(sorted((r, e["state"]) for r, e in states.items())))
            if key != last_seen:  # a step (or a state change) arrived: the clock starts again
                last_seen, since, reported = key, time.monotonic(), False
                continue
            running = len(states) == n and all(e["state"] == "running" for e in states.values())
            idle = time.monotonic() - since
            if running and not reported and idle >= self.timeout:
                reported = True
                try:
                    stacks = collect_stacks(self.rankset, list(range(n)))
                    lead = culprit.for_rankset(self.rankset, stacks, frames_of=culprit.trainer_thread).text
                    rep = report(self.run, self.timeout, idle, steps, stacks, lead)
                except Exception as exc:  # the watchdog must not die with the diagnosis
                    rep = {
                        "run": self.run,
                        "stuck": [],
                        "text": f"training {self.run}: no step for {idle:.1f} s; "
                        f"reading the ranks' stacks failed: {type(exc).__name__}: {exc}",
                    }
                self.reports.append(rep)
                try:
                    self.on_hang(rep)
                except Exception:
                    pass
