"""Tier 2: a cell's output grouped by rank ranges on real ranks (the shared 4-rank set, real magics)."""

import re

import pytest


def lines(text: str) -> list[str]:
    return [line for line in re.sub(r"\x1b\[[0-9;]*m", "", text).splitlines() if line.startswith("[rank")]


def test_identical_output_once_under_its_ranks_differing_output_per_rank(shell, capsys):
    capsys.readouterr()
    body = "import torch.distributed as dist\nr = dist.get_rank()\nprint('same everywhere')\nprint('odd' if r % 2 else 'even')\n"
    assert shell.run_cell("%%distrain --grouped\n" + body).success
    out, _ = capsys.readouterr()
    # as dshbak -c: a rank's whole output is the unit, shown once under the ranks that printed it
    assert lines(out) == [
        "[ranks 0,2] same everywhere",
        "[ranks 0,2] even",
        "[ranks 1,3] same everywhere",
        "[ranks 1,3] odd",
    ]
    assert shell.run_cell("%%distrain --grouped\nprint('same everywhere')").success
    assert lines(capsys.readouterr()[0]) == ["[ranks 0-3] same everywhere"]
    # four ranks are few: by default each rank's output stays its own, and --per-rank says so too
    for flag in ("", " --per-rank"):
        assert shell.run_cell(f"%%distrain{flag}\nprint('same everywhere')").success
        out, _ = capsys.readouterr()
        assert lines(out) == [f"[rank {r}] same everywhere" for r in range(4)]


def test_each_traceback_is_shown_once_under_rank_labels_and_a_different_one_apart(shell, capsys):
    capsys.readouterr()
    body = (
        "import torch.distributed as dist\n"
        "if dist.get_rank() < 3:\n"
        "    raise ValueError('bad batch')\n"
        "raise KeyError(dist.get_rank())\n"
    )
    result = shell.run_cell("%%distrain --grouped\n" + body)
    assert not result.success
    _, err = capsys.readouterr()
    heads = [line.split("]")[0] + "]" for line in lines(err) if "ValueError: bad batch" in line]
    # failures seen while others still run are shown at once, so the three identical tracebacks
    # may arrive in one batch or several (how they group is tests/unit/test_output_grouping.py);
    # each rank's is shown exactly once, under a label that names it
    shown = sorted(r for head in heads for r in expand(head))
    assert shown == [0, 1, 2], err
    assert any(line.startswith("[rank 3] ") and "KeyError: 3" in line for line in lines(err)), err
    assert "failed on rank(s) 0-3" in str(result.error_in_exec)


def expand(head: str) -> list[int]:
    """'[ranks 0-2,5]' -> [0, 1, 2, 5]."""
    from workbench.shared.ranges import parse_ranks

    return parse_ranks(head.strip("[]").split(" ", 1)[1], 1024)


def test_conflicting_output_flags_are_refused_with_one_message(shell):
    from workbench.notebook.commands import UsageError

    with pytest.raises(UsageError, match="usage: %%distrain"):
        shell.run_cell_magic("distrain", "--grouped --bogus", "print(1)")
    with pytest.raises(UsageError, match="--grouped and --per-rank contradict each other"):
        shell.run_cell_magic("distrain", "--grouped --per-rank", "print(1)")
