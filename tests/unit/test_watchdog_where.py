"""The step watchdog names where each rank's training thread is (``watchdog._where``): the
innermost frame, not a comprehension's own frame (Python 3.11 gives each one), and the innermost
frame of the user's or the workbench's code beside it when that is another."""

from workbench.notebook.runs.watchdog import _where

COLLECT = '"/w/workbench/engine/agreement.py", line 133 in collect'
LISTCOMP = '"/w/workbench/engine/agreement.py", line 133 in <listcomp>'
WAIT = '"/usr/lib/python3.11/threading.py", line 331 in wait'
HOOK = '"/tmp/ipykernel_1/2.py", line 7 in _hang_in_hook'


def test_a_comprehension_is_named_by_the_function_that_runs_it():
    assert _where([LISTCOMP, COLLECT]) == COLLECT


def test_library_frames_are_followed_by_the_users_own():
    assert _where([WAIT, HOOK]) == f"{WAIT} <- {HOOK}"
    assert _where([COLLECT]) == COLLECT and _where([]) == "?"
