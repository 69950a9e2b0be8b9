"""Tier 4: how a ``%%distrain`` cell reaches the ranks (an apply of ``rpc.RunCell``, see
``engine.cell_runner``): IPython syntax and plain Python behave as in a rank kernel's own
cell, and output is never lost although a quiet cell does not wait for the output stream."""

import re

import pytest

from workbench.shared.errors import RankFailure


def tagged(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("[rank")]


def plain(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)  # tracebacks come coloured


def test_ipython_syntax_and_plain_python_run_as_in_a_kernel_cell(shell2, capsys):
    capsys.readouterr()
    assert shell2.run_cell("%%distrain\n%time v = 6 * 7\n!echo from-the-shell\nv").success
    out, _ = capsys.readouterr()
    for rank in (0, 1):
        assert f"[rank {rank}] from-the-shell" in out
        assert f"[rank {rank}] Out: 42" in out
        assert any(line.startswith(f"[rank {rank}] Wall time") for line in out.splitlines())
    # a trailing ';' hides the value; the rank's execution count and history move on per cell
    assert shell2.run_cell("%%distrain\nv * 2;").success
    assert shell2.run_cell("%%distrain\ncount = get_ipython().execution_count\nlast = In[-1]").success
    assert shell2.run_cell("%%distrain\nprint(get_ipython().execution_count - count, repr(last))").success
    out, _ = capsys.readouterr()
    assert "Out: 84" not in out
    assert tagged(out) == [
        "[rank 0] 1 'count = get_ipython().execution_count\\nlast = In[-1]'",
        "[rank 1] 1 'count = get_ipython().execution_count\\nlast = In[-1]'",
    ]


def test_syntax_error_is_shown_tagged_per_rank_and_names_the_ranks(shell2, capsys):
    capsys.readouterr()
    r = shell2.run_cell("%%distrain\nx = (1 +")
    assert not r.success and "rank(s) 0-1" in str(r.error_in_exec)
    _, err = capsys.readouterr()
    assert [line for line in plain(err).splitlines() if "SyntaxError" in line] == [
        "[rank 0] SyntaxError: incomplete input",
        "[rank 1] SyntaxError: incomplete input",
    ]


@pytest.mark.parametrize(
    "body, expected",
    [
        # printed as the cell ends
        ("import time\ntime.sleep(0.02 * {i})\nprint('end', {i})", "end {i}"),
        # printed so long before the end that the rank's timed flush races the end of the cell
        ("import time\nprint('early', {i})\ntime.sleep(0.2)", "early {i}"),
    ],
    ids=["at-the-end", "timed-flush"],
)
def test_output_of_every_cell_arrives_in_full(shell2, capsys, body, expected):
    capsys.readouterr()
    for i in range(6):
        assert shell2.run_cell("%%distrain\n" + body.format(i=i)).success
        out, _ = capsys.readouterr()
        assert tagged(out) == [f"[rank 0] {expected.format(i=i)}", f"[rank 1] {expected.format(i=i)}"]


def test_a_quiet_cell_says_nothing_is_on_its_way_and_a_failing_one_still_fails(ranks2):
    """What lets the notebook skip the wait for the output stream: each rank's reply counts
    what it published; an error (sent as output) is never missed by ``result()``."""
    assert [r.published for r in ranks2.execute_async("quiet = 1").result()] == [0, 0]
    assert all(r.published > 0 for r in ranks2.execute_async("print(quiet)").result())
    for _ in range(5):
        with pytest.raises(RankFailure, match="rank 1: ZeroDivisionError"):
            ranks2.execute("from workbench import engine\nif engine.rank == 1:\n    1 / 0")
