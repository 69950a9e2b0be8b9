"""Tier 4: a rank that fails while the others wait is shown at once (real magics, a private 2-rank set)."""

import re
import sys
import time

import pytest
from conftest import _session_ranks

from workbench.notebook.commands import UsageError


@pytest.fixture(scope="module")
def own2():
    """2 ranks of this module's own: freeing a rank stuck in a collective closes and re-makes
    the process group, which a set shared with other tests (their subgroups and wrappers on
    the old group) would not come through."""
    yield from _session_ranks(2)


@pytest.fixture
def shell2(own2):
    """A real IPython shell whose current rank set is this module's 2-rank one."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    from workbench.notebook import session

    previous = session.using(own2)
    previous.__enter__()
    yield ip
    previous.__exit__()


def record(monkeypatch, name):
    """(time.time(), text) of everything written to sys.<name>."""
    writes = []

    class Recorder:
        def write(self, text):
            writes.append((time.time(), text))

        def flush(self):
            pass

    monkeypatch.setattr(sys, name, Recorder())
    return writes


RAISE_WHILE_OTHER_REDUCES = (
    "import time, torch, torch.distributed as dist\n"
    "t = torch.ones(1)\n"
    "if dist.get_rank() == 1:\n"
    "    raise ValueError(f'boom at {time.time()!r}')\n"
    "dist.all_reduce(t)\n"
)


def all_reduce_works(shell, capsys) -> None:
    capsys.readouterr()
    r = shell.run_cell(
        "%%distrain\nimport torch, torch.distributed as dist\n"
        "t = torch.ones(1)\ndist.all_reduce(t)\nprint('sum', t.item())"
    )
    assert r.success, r.error_in_exec
    out, _ = capsys.readouterr()
    assert "[rank 0] sum 2.0" in out and "[rank 1] sum 2.0" in out


def test_failing_rank_shown_at_once_others_interrupted_after_grace(shell2, monkeypatch, capsys):
    err = record(monkeypatch, "stderr")
    r = shell2.run_cell("%%distrain --grace 2\n" + RAISE_WHILE_OTHER_REDUCES)
    t_end = time.time()
    assert not r.success
    raised_at = float(re.search(r"boom at ([0-9.]+)", str(r.error_in_exec)).group(1))
    shown = [t for t, text in err if "[rank 1]" in text and "boom at" in text]
    assert shown, "rank 1's traceback was never shown"
    assert shown[0] - raised_at < 1.0, f"traceback shown {shown[0] - raised_at:.2f} s after the raise"
    notice = [(t, text) for t, text in err if "still running" in text]
    assert notice and notice[0][1].startswith("rank 1 failed; rank 0 still running — likely waiting in a collective")
    assert t_end - raised_at >= 2.0, "rank 0 was interrupted before the grace ran out"
    message = str(r.error_in_exec)
    assert message.splitlines()[0].startswith("rank 1 failed first: ValueError: boom at")
    assert "rank 0 was still running and interrupted after 2 s" in message
    assert re.search(r"\[rank 0\] .*distributed_c10d.py.* in all_reduce", message)
    assert "the process group was re-initialised" in message
    assert list(r.error_in_exec.failures)[0] == 1  # the root cause first
    monkeypatch.undo()
    all_reduce_works(shell2, capsys)  # gloo: the old group was broken; the new one works


def test_fail_fast_interrupts_at_once_and_keeps_a_group_not_in_use(shell2, capsys):
    t0 = time.monotonic()
    r = shell2.run_cell(
        "%%distrain --fail-fast\nimport time, torch.distributed as dist\n"
        "if dist.get_rank() == 1:\n    raise KeyError('early')\ntime.sleep(120)"
    )
    assert not r.success
    assert time.monotonic() - t0 < 30, "the sleeping rank was not interrupted"
    message = str(r.error_in_exec)
    assert message.startswith("rank 1 failed first: KeyError: 'early'")
    assert "interrupted at once (--fail-fast)" in message
    assert "not inside a collective: the process group is usable as it is" in message
    assert r.error_in_exec.failures[0][0] == "KeyboardInterrupt"
    all_reduce_works(shell2, capsys)


@pytest.mark.parametrize(
    "flags, says",
    [
        ("--grace -1", "argument --grace: expected 0 or a positive number"),
        ("--grace 2 --fail-fast", "--grace and --fail-fast contradict each other"),
        ("--grace soon", "usage: %%distrain"),
    ],
)
def test_bad_grace_is_refused_before_anything_runs(shell2, capsys, flags, says):
    r = shell2.run_cell(f"%%distrain {flags}\nran_it = True")
    assert isinstance(r.error_in_exec, UsageError) and says in str(r.error_in_exec)
    capsys.readouterr()
    assert shell2.run_cell("%%distrain\nprint('ran', 'ran_it' in dir())").success
    out, _ = capsys.readouterr()
    assert "[rank 0] ran False" in out and "[rank 1] ran False" in out


def test_auto_mode_round_trip_in_the_shell(shell2, capsys):
    from workbench.notebook import auto_cells

    shell2.user_ns.pop("on_ranks", None)
    try:
        assert shell2.run_cell("%distrain auto on").success
        assert "auto mode on" in capsys.readouterr()[0]
        r = shell2.run_cell("on_ranks = 7\nprint('value', on_ranks)")
        assert r.success, r.error_in_exec
        out, _ = capsys.readouterr()
        assert out.splitlines()[0] == auto_cells.MARKER
        assert "[rank 0] value 7" in out and "[rank 1] value 7" in out
        assert "on_ranks" not in shell2.user_ns  # it ran on the ranks, not here
        r = shell2.run_cell("%%local\nhere_only = 3\nprint('local', here_only)")
        assert r.success and shell2.user_ns["here_only"] == 3
        out, _ = capsys.readouterr()
        assert "local 3" in out and "[rank" not in out and auto_cells.MARKER not in out
        r = shell2.run_cell("%distrain status")  # magics still run in the notebook
        assert r.success and list(r.result.index) == [0, 1]
        r = shell2.run_cell("%distrain auto maybe")
        assert isinstance(r.error_in_exec, UsageError) and "invalid choice: 'maybe'" in str(r.error_in_exec)
        assert auto_cells.is_on(shell2)  # a bad argument changed nothing
        assert shell2.run_cell("%distrain auto off").success
        capsys.readouterr()
        r = shell2.run_cell("print('back', 'on_ranks' in dir())")
        assert r.success
        assert capsys.readouterr()[0] == "back False\n"
    finally:
        auto_cells.turn_off(shell2)
