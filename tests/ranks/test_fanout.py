"""Tier 2: calls through the controller's broadcast tree (``cluster.fanout``) on real ranks.

Sets of ``fanout.FANOUT_FROM`` ranks or more take this path; here the shared 4-rank set is made
to take it (``fanout_from = 0``) for the module, so that what a user relies on (output per rank,
results in rank order, failures named by rank, the first failing rank shown while others still
run, busy ranks in status) is checked on the fanned path too. The 64-rank set takes it by
itself (test_scale_64.py).
"""

import re
import time

import pytest
from conftest import ranks_in_loop

from workbench.shared import wire
from workbench.shared.errors import RankFailure


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def tagged(text: str) -> list[str]:
    return [line for line in plain(text).splitlines() if line.startswith("[rank")]


@pytest.fixture
def fanned(shell, ranks4):
    """The shared 4-rank set, its calls fanned out through the broadcast tree (restored after)."""
    before = ranks4.fanout_from
    ranks4.fanout_from = 0
    try:
        yield ranks4
    finally:
        ranks4.fanout_from = before


def _rank():
    import torch.distributed as dist

    return dist.get_rank()


def _fail_on(ranks):
    import torch.distributed as dist

    if dist.get_rank() in ranks:
        raise ZeroDivisionError(f"rank {dist.get_rank()} divided by zero")
    return dist.get_rank()


def test_a_fanned_call_is_one_request_and_its_results_come_in_rank_order(fanned):
    call = fanned.submit(_rank)
    assert call.fanned is not None  # one coalesced reply, not one per rank
    assert call.result(timeout=60) == [0, 1, 2, 3]
    assert fanned.apply(_rank, ranks="1,3") == [1, 3]
    # the same reply from every rank reaches the notebook once: the tree merged them by content
    same = fanned.submit(_fail_on, [])
    assert same.result(timeout=60) == [0, 1, 2, 3]
    alike = fanned.submit(len, "four")
    assert alike.result(timeout=60) == [4] * 4
    assert len(same.ar.get()) == 1 + 4 and len(alike.ar.get()) == 1 + 1  # a header, then each distinct reply


def test_push_and_pull_through_the_tree(fanned):
    fanned.push({"pushed_once": [1, 2, 3]})
    assert fanned.pull("pushed_once") == [[1, 2, 3]] * 4
    fanned.push({"pushed_once": "two"}, ranks=[2])
    assert fanned.pull("pushed_once", ranks="1-2") == [[1, 2, 3], "two"]
    with pytest.raises(RankFailure, match="NameError: name 'never_pushed' is not defined"):
        fanned.pull("never_pushed")
    fanned.execute("del pushed_once")


def test_a_notebooks_function_and_class_are_pushed_by_value_through_the_tree(fanned):
    """As ipyparallel's own push sends them: defined in the notebook, they have no module a rank imports."""
    notebook = {"__name__": "__main__"}
    exec("def double(x):\n    return 2 * x\nclass Box:\n    size = 3", notebook)
    fanned.push({"double": notebook["double"], "Box": notebook["Box"]})
    fanned.execute("doubled = double(21) * Box.size")
    assert fanned.pull("doubled") == [126] * 4
    fanned.execute("del double, Box, doubled")


def test_a_quiet_fanned_cell_sends_nothing_per_rank_to_the_notebook(fanned):
    call = fanned.execute_async("x_fanned = 1")
    call.result(timeout=60)
    # no status, no output: the client holds no message of any rank for this call
    assert all(md == {} for md in call.fanned.metadata())
    assert call.wait_for_output(0)


def test_fanned_cells_show_each_ranks_output_results_and_fd_output(fanned, shell, capsys):
    capsys.readouterr()
    body = (
        "import os, torch.distributed as dist\n"
        "r = dist.get_rank()\n"
        "print('printed by', r)\n"
        "os.write(1, f'written to fd 1 by {r}\\n'.encode())\n"
        "r * 10\n"
    )
    assert shell.run_cell("%%distrain --per-rank\n" + body).success
    out = tagged(capsys.readouterr().out)
    for r in range(4):
        assert f"[rank {r}] printed by {r}" in out, out
        assert f"[rank {r}] written to fd 1 by {r}" in out, out
        assert f"[rank {r}] Out: {r * 10}" in out, out
    assert shell.run_cell("%%distrain --grouped\nprint('alike')").success
    assert tagged(capsys.readouterr().out) == ["[ranks 0-3] alike"]


def test_a_fanned_call_that_raises_names_its_ranks_and_leaves_the_others_usable(fanned):
    with pytest.raises(RankFailure) as info:
        fanned.apply(_fail_on, [1, 2], timeout=60)
    assert sorted(info.value.failures) == [1, 2]
    assert "rank 1: ZeroDivisionError: rank 1 divided by zero" in str(info.value)
    assert "divided by zero" in info.value.failures[2][2]  # the rank's traceback
    assert fanned.apply(_fail_on, [], timeout=60) == [0, 1, 2, 3]


def test_the_first_failing_rank_is_shown_while_the_others_still_run(fanned, shell, capsys):
    capsys.readouterr()
    body = "import time, torch.distributed as dist\nif dist.get_rank() == 1:\n    raise ValueError('early')\ntime.sleep(30)\n"
    t0 = time.monotonic()
    result = shell.run_cell("%%distrain --grace 1\n" + body)
    assert time.monotonic() - t0 < 15  # not the 30 s the others would sleep
    assert isinstance(result.error_in_exec, RankFailure)
    assert "rank 1 failed first: ValueError: early" in str(result.error_in_exec)
    err = plain(capsys.readouterr().err)
    assert "rank 1 failed; ranks 0, 2, 3 still running" in err, err
    assert shell.run_cell("%%distrain\nprint('after')").success


def test_status_says_busy_while_a_fanned_cell_runs(fanned):
    call = fanned.execute_async("import time\ntime.sleep(1.5)")
    try:
        deadline = time.monotonic() + 1.0
        states = []
        while time.monotonic() < deadline and set(states) != {"busy"}:
            states = [row["state"] for row in fanned.status()]
        assert states == ["busy"] * 4
    finally:
        call.result(timeout=60)
    assert [row["state"] for row in fanned.status()] == ["idle"] * 4


def test_output_marker_follows_output_only_for_ranks_that_printed(fanned):
    call = fanned.execute_async("import torch.distributed as dist\nif dist.get_rank() == 2:\n    print('only two')")
    call.result(timeout=60)
    mds = call.fanned.metadata()
    assert [wire.OUTPUT_DONE in (md.get("data") or {}) for md in mds] == [False, False, True, False]
    assert mds[2]["stdout"] == "only two\n"


ALL_REDUCE_LOOP = """
import os, torch, torch.distributed as dist
t = torch.ones(1)
for i in range(100000):
    dist.all_reduce(t)
    t.fill_(1)
    if i == 0:  # every rank is in the loop
        open(os.path.join({folder!r}, f"in-loop-{{dist.get_rank()}}"), "w").close()
"""


def test_a_rank_killed_during_a_fanned_call_is_named_and_the_survivors_answer_after(fresh_ranks, tmp_path):
    """The tree's reply never comes when a rank dies (it waits for every rank): the death is
    seen by pid as on the direct path, and the survivors take new calls once out of their collective."""
    import os
    import signal

    from workbench.notebook.cluster import RankDied

    rs = fresh_ranks(4, collective_timeout=6)
    rs.fanout_from = 0
    call = rs.execute_async(ALL_REDUCE_LOOP.format(folder=str(tmp_path)))
    ranks_in_loop(tmp_path, 4)
    victim = rs.procs[2].pid
    os.kill(victim, signal.SIGKILL)
    with pytest.raises(RankDied) as err:
        call.result()
    assert f"rank 2 (host {rs.procs[2].host}, pid {victim}) killed by SIGKILL" in str(err.value)
    # a survivor linked to the dead rank fails at once; the others wait in their all_reduce until
    # the collective timeout (6 s): each one is busy until its own failure arrives
    states = [r["state"] for r in rs.status()]
    assert states[2] == "dead" and set(states[:2] + states[3:]) <= {"busy", "idle"}, states
    deadline = time.monotonic() + 6 + 10
    while time.monotonic() < deadline and any(r["state"] == "busy" for r in rs.status()):
        time.sleep(0.2)
    assert [r["state"] for r in rs.status()] == ["idle", "idle", "dead", "idle"]
    assert rs.apply(_rank, ranks=[0, 1, 3], timeout=60) == [0, 1, 3]


def test_a_cell_on_1024_SIMULATED_ranks_comes_back_per_rank_through_the_fan_out(tmp_path, capsys):
    """A SIMULATION (tests/sim_controller.py): the real rank set, client and fan-out in this
    process, a stand-in controller answering as the broadcast tree does for 1024 ranks."""
    import sim_controller

    from workbench.notebook.cluster.cell import run_cell
    from workbench.shared import replies

    with sim_controller.simulated_rankset(1024, str(tmp_path)) as rs:
        call = run_cell(rs, "pass")
        assert call.fanned is not None
        assert call.result(timeout=30) == [replies.CellRun(published=0)] * 1024
    assert capsys.readouterr().out == ""  # a quiet cell shows nothing, on any number of ranks
