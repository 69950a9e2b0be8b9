"""The run contract without ranks: the registry of kinds refuses a second kind under a taken name,
a session holds one current run (the one before stops being watched), and a detach carries the
run part through its kind's ``to_state``/``from_state``, or refuses a kind that cannot move while
it runs, before anything changes. The kinds on real ranks: tests/ranks/test_recovery.py,
test_fault_tolerant.py, test_detach.py, test_trainer_integration.py."""

from __future__ import annotations

import pytest

from workbench.notebook import runs
from workbench.notebook.session import Session

pytestmark = pytest.mark.pure


class Drill(runs.Run):
    """A kind of run that does nothing but remember."""

    kind = "drill"

    def __init__(self, sess, run_id: str, *, ended: bool = False, movable: bool = True):
        self.sess, self.run_id, self.ended, self.closed = sess, run_id, ended, False
        self.cannot_carry = "" if movable else "a drill cannot move while it runs"

    state = property(lambda self: "closed" if self.closed else "finished" if self.ended else "running")
    records = property(lambda self: [])

    def status_text(self) -> str:
        return f"drill {self.run_id}: {self.state}"

    def wait(self, timeout=None) -> bool:
        return self.ended or self.closed

    def stop(self) -> str:
        self.ended = True
        return "stopped"

    def close(self) -> None:
        self.closed = True

    def to_state(self):
        if self.cannot_carry and not self.wait(0):
            raise runs.CannotCarry(self.cannot_carry)
        self.close()
        return {"run_id": self.run_id}

    @classmethod
    def from_state(cls, sess, state):
        return cls(sess, state["run_id"])


@pytest.fixture
def drill_kind():
    runs.register(Drill)
    yield Drill
    del runs.KINDS["drill"]


def test_a_second_kind_under_a_taken_name_is_refused(drill_kind):
    class Other(Drill):
        pass

    with pytest.raises(TypeError, match=r"two kinds of run named 'drill': .*Drill and .*Other"):
        runs.register(Other)
    assert runs.KINDS["drill"] is Drill
    assert {"trainer", "failure budget", "fault-tolerant"} <= set(runs.KINDS)


def test_one_current_run_and_the_one_before_is_no_longer_watched(drill_kind):
    sess = Session("s")
    first = runs.adopt(sess, Drill(sess, "a"))
    second = runs.adopt(sess, Drill(sess, "b"))
    assert runs.current(sess) is second and first.closed and not second.closed
    assert runs.summary(second) == {"id": "b", "kind": "drill", "state": "running", "text": "drill b: running"}


def test_detach_carries_the_run_part_through_the_kind(drill_kind):
    here, there = Session("s"), Session("s")
    runs.begin(here, "a", 7)
    runs.note_hang(here, {"run": "a", "text": "no step for 30 s"})
    run = runs.adopt(here, Drill(here, "a"))
    carried = runs.carry(here)
    assert run.closed and runs.current(here) is None  # watched here no more
    runs.take(there, carried)
    taken = runs.current(there)
    assert type(taken) is Drill and taken.run_id == "a" and taken.sess is there and not taken.closed
    assert there.runs.marks == {"a": 7} and there.runs.started == "a" and there.hangs[0]["text"] == "no step for 30 s"


def test_a_kind_that_cannot_move_is_refused_while_it_runs_and_carried_as_nothing_once_ended(drill_kind):
    sess = Session("s")
    run = runs.adopt(sess, Drill(sess, "a", movable=False))
    assert runs.carry_refusal(sess) == "a drill cannot move while it runs"
    run.stop()
    assert runs.carry_refusal(sess) is None
