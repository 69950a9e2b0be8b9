"""The workbench trainer's run (``train start``), with its optional step watchdog (``--step-timeout``).

The ranks' trainer threads do the work; this side reads their stream. Its end is the stream's
end state on every rank confirmed by the ranks themselves (:class:`~workbench.engine.rpc.EndOfRun`):
a rank says "finished" from its training thread, which then still sends its last events and
may be writing the last step's auto-save.
"""

from __future__ import annotations

import math
import time

from ...engine import rpc
from .contract import ENDED, Run, register
from .part import note_hang

SETTLE_S = 30.0  # how long ``wait()`` without a timeout gives the ranks past the stream's end


def settle(rankset, run_id: str, timeout: float, ranks=None) -> bool:
    """True once nothing of run ``run_id`` still works on any rank of ``rankset`` (or of ``ranks``),
    asked of the ranks, who wait at most ``timeout`` for it."""
    request = rpc.EndOfRun(run_id=run_id, timeout=timeout)
    replies = rankset.apply(rpc.handle, request, ranks=ranks, timeout=timeout + 30)
    return all(r.ended for r in replies)


@register
class TrainerRun(Run):
    """``run_id`` of ``sess``'s trainer from status event ``mark`` on, up to step ``target``."""

    kind = "trainer"

    def __init__(self, sess, run_id: str, *, target: int, mark: int, step_timeout: float | None = None):
        self.sess, self.rankset, self.run_id = sess, sess.rankset, run_id
        self.store = sess.store
        self.target, self.mark, self.step_timeout = int(target), int(mark), step_timeout
        self._end: str | None = None  # the final state, once the ranks confirmed it
        self._closed = False
        self.watchdog = None
        if step_timeout:
            from .watchdog import StepWatchdog

            self.watchdog = StepWatchdog(
                self.rankset, self.store, run_id, step_timeout, mark=mark, on_hang=lambda rep: note_hang(sess, rep)
            )

    # ------------------------------------------------------------------ reading
    def _states(self) -> dict[int, dict]:
        return self.store.run_state(self.run_id, self.mark)

    @property
    def state(self) -> str:
        if self._end is not None:
            return self._end
        if self._closed:
            return "closed"
        kinds = sorted({e["state"] for e in self._states().values()})
        return ", ".join(kinds) or "starting"

    @property
    def records(self) -> list[dict]:
        return [h for h in self.sess.runs.hangs if h.get("run") == self.run_id]

    def status_text(self) -> str:
        last = self.store.last_steps(self.run_id)
        head = (
            f"training {self.run_id}: {self.state} at step {max(last.values()) if last else 0} of {self.target} "
            f"on {self.rankset.world_size} ranks"
        )
        if self.step_timeout:
            head += f"; step timeout {self.step_timeout:g} s, {len(self.records)} hangs reported"
        return "\n".join([head, *("  " + self.describe(r) for r in self.records)])

    @classmethod
    def describe(cls, record: dict) -> str:
        return record["text"].splitlines()[0]

    # ------------------------------------------------------------------ waiting, ending
    def _ended_on_stream(self, store) -> bool:
        st = store.run_state(self.run_id, self.mark)
        return len(st) == self.rankset.world_size and all(e["state"] in ENDED for e in st.values())

    def wait(self, timeout: float | None = None) -> bool:
        if self._end is not None or self._closed:
            return True
        deadline = time.monotonic() + (math.inf if timeout is None else timeout)
        if not self.store.wait(self._ended_on_stream, max(0.0, deadline - time.monotonic())):
            return False
        left = SETTLE_S if timeout is None else max(0.0, deadline - time.monotonic())
        if not settle(self.rankset, self.run_id, left):
            return False
        states = {e["state"] for e in self._states().values()}
        self._end = "error" if "error" in states else "finished" if states == {"finished"} else "stopped"
        if self.watchdog is not None:
            self.watchdog.close()
        self._changed()
        return True

    def stop(self) -> str:
        self.rankset.apply(rpc.handle, rpc.ControlTraining(action="stop"))
        return "stop requested: takes effect on every rank at the same step"

    def close(self) -> None:
        self._closed = True
        if self.watchdog is not None:
            self.watchdog.close()

    # ------------------------------------------------------------------ carrying
    def to_state(self) -> dict | None:
        if self._end is not None or self._closed:
            return None
        self.close()
        return {"run_id": self.run_id, "target": self.target, "mark": self.mark, "step_timeout": self.step_timeout}

    @classmethod
    def from_state(cls, sess, state: dict) -> TrainerRun:
        return cls(
            sess, state["run_id"], target=state["target"], mark=state["mark"], step_timeout=state["step_timeout"]
        )
