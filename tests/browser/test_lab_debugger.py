"""JupyterLab's own debugger on two ranks: the bug icon, a gutter breakpoint in a ``%%distrain``
cell, the call stack with every rank, the variables panel switching between ranks, continue.

The ranks are started by the notebook's kernel; the screenshot the test leaves while both ranks
are stopped (``test-artifacts/lab_debugger_two_ranks.png``) is the one in ``docs/cells.md``
(``docs/images/debugger.png``). The same with a rank on a second host: tests/cluster.
"""

from __future__ import annotations

import socket

import pytest

from .debugger_steps import START, check_both_ranks_then_continue, notebook, run_to_the_breakpoint

pytestmark = [pytest.mark.browser, pytest.mark.timeout(300)]


def test_debugger_stops_both_ranks_at_a_gutter_breakpoint(page, lab):
    run_to_the_breakpoint(page, lab, notebook("two_ranks.ipynb", START))
    here = socket.gethostname()
    check_both_ranks_then_continue(page, hosts=[here, here], shot_name="lab_debugger_two_ranks")
    assert not page.js_errors, page.js_errors
