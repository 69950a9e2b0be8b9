"""Tier 4: how a ``%%distrain`` cell reaches the ranks (an apply of ``rpc.RunCell``, see
``engine.cell_runner``): IPython syntax and plain Python behave as in a rank kernel's own
cell, and output is never lost although a quiet cell does not wait for the output stream."""

import re
import time

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
    # in the order the ranks failed: one that fails first is shown at once (cluster.stragglers)
    assert sorted(line for line in plain(err).splitlines() if "SyntaxError" in line) == [
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


def _sent() -> int:
    from IPython import get_ipython

    return get_ipython().kernel.session.message_count


def test_a_rank_sends_a_reply_and_an_idle_per_request_and_logs_no_line_per_cell(ranks2):
    """What a rank's kernel does per request beyond the cell (``cell_runner.lighten_kernel``):
    between two reads of its message count one request went by, whose messages are its
    reply and the "idle" that marks its output complete, with no "busy" before it; the
    engine's log takes warnings, not a line per request."""
    import logging

    for _ in range(3):
        first, second = ranks2.apply(_sent), ranks2.apply(_sent)
        assert [b - a for a, b in zip(first, second)] == [2, 2]
    assert ranks2.apply(lambda: __import__("IPython").get_ipython().kernel.log.level) == [logging.WARNING] * 2
    assert [r.published for r in ranks2.execute_async("quiet = 2").result()] == [0, 0]  # still counted right


def test_top_level_await_runs_as_in_a_kernel_cell(shell2, capsys):
    """The rank's kernel loop is busy with the cell's own request: the cell awaits on a loop
    of its own, and prints, its value and its error arrive as from any cell."""
    capsys.readouterr()
    assert shell2.run_cell("%%distrain\nimport asyncio\nawait asyncio.sleep(0.1)\nprint('done')").success
    assert shell2.run_cell("%%distrain\nawait asyncio.sleep(0.01, result=6 * 7)").success
    out, _ = capsys.readouterr()
    assert tagged(out) == ["[rank 0] done", "[rank 1] done", "[rank 0] Out: 42", "[rank 1] Out: 42"]
    r = shell2.run_cell("%%distrain\nawait asyncio.sleep(0)\n1 / 0")
    assert not r.success and "rank(s) 0-1" in str(r.error_in_exec)
    _, err = capsys.readouterr()
    assert sorted(line for line in plain(err).splitlines() if line.endswith("division by zero")) == [
        "[rank 0] ZeroDivisionError: division by zero",
        "[rank 1] ZeroDivisionError: division by zero",
    ]
    # the ranks' own loop is back: plain cells and calls run as before
    assert shell2.run_cell("%%distrain\nprint('after')").success
    assert tagged(capsys.readouterr()[0]) == ["[rank 0] after", "[rank 1] after"]


@pytest.mark.parametrize(
    "body, ename",
    [("await asyncio.sleep(60)", "CancelledError"), ("await asyncio.sleep(0)\ntime.sleep(60)", "KeyboardInterrupt")],
    ids=["while-awaiting", "while-running"],
)
def test_an_interrupted_await_cell_ends_and_never_resumes(ranks2, body, ename):
    """Ctrl-C / interrupt: at an ``await`` the cell is cancelled (as in a Jupyter kernel), in
    its own code it raises KeyboardInterrupt; a later cell's await does not resume it."""
    import time

    ranks2.execute("import asyncio, time\nresumed = False")
    call = ranks2.execute_async(body + "\nresumed = True")
    time.sleep(1.0)
    ranks2.interrupt()
    with pytest.raises(RankFailure, match=f"rank 0: {ename}.*rank 1: {ename}"):
        call.result(timeout=20)
    ranks2.execute("await asyncio.sleep(0.2)")
    assert ranks2.pull("resumed") == [False, False]


def test_output_written_below_python_reaches_the_notebook_tagged_per_rank(shell2, capsys):
    """What C code, a C library or a child process writes to fd 1/2 is shown with the cell,
    tagged per rank like a print, also when written as the cell ends."""
    capsys.readouterr()
    cell = (
        "%%distrain\nimport ctypes, os, subprocess\nlibc = ctypes.CDLL(None)\n"
        "libc.puts(b'from C')\nlibc.fflush(None)\n"
        "subprocess.run(['echo', 'from a child'])\n"
        "os.write(2, b'fd 2\\n')\nos.write(1, b'fd 1\\n');"
    )
    for _ in range(5):
        assert shell2.run_cell(cell).success
        out, err = capsys.readouterr()
        assert tagged(out) == [f"[rank {r}] {text}" for r in (0, 1) for text in ("from C", "from a child", "fd 1")], out
        assert tagged(err) == ["[rank 0] fd 2", "[rank 1] fd 2"], err


def test_a_widget_shown_on_a_rank_does_not_stall_a_terminal_shell(shell2, capsys):
    """A widget's comm message from a rank (transformers' progress bars are widgets) once left
    the call's output never complete in a terminal IPython: the cell waited out its 30 s output
    timeout. ``%load_ext workbench`` marks such a shell as having no kernel, as a script has."""
    assert shell2.kernel is None
    capsys.readouterr()
    t0 = time.monotonic()
    assert shell2.run_cell("%%distrain\nimport ipywidgets\ndisplay(ipywidgets.IntProgress(3))\nprint('after')").success
    took = time.monotonic() - t0
    out, _ = capsys.readouterr()
    assert "[rank 0] after" in out and "[rank 1] after" in out
    assert took < 20, f"the cell took {took:.1f} s (an output stall is 30 s)"
