"""A hang report leads with its culprit, on real gloo ranks: the rank the others wait for in a
collective is named (and only it), with the function and line of the user's code it is in; two
ranks stuck in two places are both named; a mismatched collective is named as one. The cell's
timeout, ``%distrain where`` and 16 ranks alike; within the timeout plus 2 s.

The shared 4-rank set is let go by a flag file (the stuck rank returns and enters the
collective); the 16-rank set ends stuck in a mismatch and is stopped."""

import re
import time

import pytest

from workbench.notebook import api, session
from workbench.notebook.cluster import RankSet
from workbench.shared.errors import CellTimeout

# rank 2 is in a data loader that never returns while the others wait in the next all_reduce
HANG = """import os, time, torch, torch.distributed as dist
def load_next_batch():
    while not os.path.exists({flag!r}):
        time.sleep(0.02)
    return torch.ones(4)
t = torch.ones(4)
for step in range(3):
    dist.all_reduce(t)
if dist.get_rank() == 2:
    batch = load_next_batch()
dist.all_reduce(t)
"""
TIMEOUT = 3.0


def waits(ranks: str, op: str = "all_reduce") -> str:
    return rf"{ranks} wait in {op} #\d+ \(group world\) for \d+\.\d s; "


def run_stuck(code: str, *, shell=None) -> tuple[CellTimeout, float]:
    """Run ``code`` with ``--timeout``; the timeout it raises and how long the cell took."""
    t0 = time.monotonic()
    if shell is not None:
        result = shell.run_cell(f"%%distrain --timeout {TIMEOUT:g}\n{code}")
        error = result.error_in_exec
    else:
        with pytest.raises(CellTimeout) as info:
            api.run(code, timeout=TIMEOUT)
        error = info.value
    took = time.monotonic() - t0
    assert isinstance(error, CellTimeout), error
    return error, took


def test_the_hung_rank_is_named_first_with_its_function_and_cell_line(shell, ranks4, tmp_path, capsys):
    flag = tmp_path / "go"
    try:
        error, took = run_stuck(HANG.format(flag=str(flag)), shell=shell)
        first = str(error).splitlines()[0]
        expected = waits("ranks 0-1,3") + r"rank 2 never entered it: it is in load_next_batch \(cell line 4\)"
        assert re.fullmatch(expected, first), str(error)
        assert error.culprit.culprits == [2] and error.culprit.waiting == [0, 1, 3]
        assert took <= TIMEOUT + 2, took
        capsys.readouterr()
        shell.run_line_magic("distrain", "where")
        out = capsys.readouterr().out
        assert re.fullmatch(expected, out.splitlines()[0]), out  # `where` leads with the same
    finally:
        flag.touch()  # rank 2's loader returns, it enters the all_reduce, the cell ends
    assert ranks4.execute("print(1)", timeout=60) is not None


def test_two_ranks_stuck_in_two_places_are_both_named(ranks4, tmp_path):
    flag = tmp_path / "go"
    code = HANG.format(flag=str(flag)).replace(
        "if dist.get_rank() == 2:\n    batch = load_next_batch()\n",
        "if dist.get_rank() == 1:\n    batch = load_next_batch()\n"
        "if dist.get_rank() == 2:\n    import culprit_ranks\n"
        f"    culprit_ranks.save_checkpoint({str(flag)!r})\n",
    )
    try:
        error, took = run_stuck(code)
        first = str(error).splitlines()[0]
        assert re.fullmatch(
            waits("ranks 0,3") + r"ranks 1-2 never entered it: rank 1 is in load_next_batch \(cell line 4\); "
            r"rank 2 is in save_checkpoint \(culprit_ranks.py line 10\)",
            first,
        ), str(error)
        assert error.culprit.culprits == [1, 2]
        assert took <= TIMEOUT + 2, took
    finally:
        flag.touch()
    assert ranks4.execute("print(1)", timeout=60) is not None


@pytest.fixture(scope="module")
def ranks16():
    from conftest import RANK_SYS_PATH, alive

    rs = RankSet.start(n=16, backend="gloo", threads=1, sys_path=RANK_SYS_PATH)
    try:
        with session.using(rs):
            yield rs
    finally:
        pids = list(rs.started_pids)
        rs.stop()
        assert alive(pids) == [], f"processes left behind by the 16-rank set: {alive(pids)}"


def test_at_16_ranks_only_the_hung_rank_is_named_in_one_line(ranks16, tmp_path):
    flag = tmp_path / "go"
    try:
        error, took = run_stuck(HANG.format(flag=str(flag)))
        lead = str(error).split("\nthe cell is still running")[0]
        assert "\n" not in lead, lead  # one line
        assert re.fullmatch(
            waits("ranks 0-1,3-15") + r"rank 2 never entered it: it is in load_next_batch \(cell line 4\)", lead
        ), str(error)
        assert error.culprit.culprits == [2]
        assert took <= TIMEOUT + 2, took
    finally:
        flag.touch()
    assert ranks16.execute("print(1)", timeout=60) is not None


def test_one_rank_all_gathering_while_the_others_all_reduce_is_named_a_mismatch(ranks16):
    """Left stuck: gloo never matches the two (the module's set is stopped after it)."""
    code = (
        "import torch, torch.distributed as dist\nt = torch.ones(4)\n"
        "if dist.get_rank() == 2:\n    dist.all_gather([torch.zeros(4) for _ in range(16)], t)\n"
        "else:\n    dist.all_reduce(t)\n"
    )
    error, took = run_stuck(code)
    first = str(error).splitlines()[0]
    assert re.fullmatch(
        r"mismatched collective #\d+ \(group world\): ranks 0-1,3-15 call all_reduce float32\[4\]; "
        r"rank 2 calls all_gather 16 x float32\[4\]",
        first,
    ), str(error)
    assert error.culprit.mismatch
    assert took <= TIMEOUT + 2, took
