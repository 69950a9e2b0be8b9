"""A flood of output on real ranks never drowns the notebook: 4 ranks printing 200,000 lines each
through ``%%distrain``, the notebook process grows by <= 30 MiB, the output kept is <= 1 MiB and
says how much of each rank's was cut and how to see it, every line is in the ranks' log files,
and ``%distrain logs`` shows them (the last lines, or those matching). The flood's cost against
printing to /dev/null is benchmarks/output_flood_bench.py."""

import gc
import os
import re

import psutil

from workbench.engine import rpc
from workbench.shared import output_cut, rank_logs

LINES = 200_000
FLOOD = f"for i in range({LINES}):\n    print(f'step {{i}} loss 0.123456 lr 3e-4 some more text here')\n"


def shown(text: str, rank: int) -> list[str]:
    tag = f"[rank {rank}] "
    return [line[len(tag) :] for line in text.splitlines() if line.startswith(tag)]


def last_cell(log: str) -> list[str]:
    """The lines of the latest cell in a rank's log (below its header)."""
    with open(log, encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    starts = [i for i, line in enumerate(lines) if line.startswith("──── cell at ")]
    return lines[starts[-1] + 1 :]


def test_a_flood_keeps_the_notebook_small_says_what_was_cut_and_logs_every_line(shell, ranks4, capsys):
    capsys.readouterr()
    gc.collect()
    before = psutil.Process().memory_info().rss
    assert shell.run_cell("%%distrain\n" + FLOOD).success
    grown = psutil.Process().memory_info().rss - before
    out, err = capsys.readouterr()
    assert grown <= 30 * 2**20, f"the notebook process grew by {grown / 2**20:.1f} MiB"
    assert len(out.encode()) + len(err.encode()) <= 2**20, len(out)
    want = [f"step {i} loss 0.123456 lr 3e-4 some more text here" for i in range(LINES)]
    for rank in range(4):
        lines = shown(out, rank)
        cut = [line for line in lines if "cut here" in line]
        assert len(cut) == 1, cut
        assert f"`%distrain logs --ranks {rank} --tail 200`" in cut[0] and "--output all" in cut[0]
        kept = [line for line in lines if line.startswith("step ")]
        (n_cut, _) = output_cut.cut_count(cut[0])
        assert n_cut + len(kept) == LINES  # what was cut, counted to the line
        head = lines[: lines.index(cut[0])]
        assert head == want[: len(head)] and kept[len(head) :] == want[LINES - (len(kept) - len(head)) :]
        assert last_cell(rank_logs.path(ranks4.state_dir(), rank)) == want  # every line, in order
    capsys.readouterr()
    shell.run_line_magic("distrain", "logs --ranks 3 --tail 200")
    out = capsys.readouterr().out
    assert shown(out, 3) == want[-200:]
    assert not shown(out, 0)
    shell.run_line_magic("distrain", "logs --grep 'step 123456 '")
    out = capsys.readouterr().out
    for rank in range(4):
        body = shown(out, rank)
        assert body[0].startswith("1 line(s) match"), out
        number, text = body[1].split(": ", 1)
        assert text == want[123456] and int(number) > 123456  # numbered from the log's first line


def test_a_rank_reads_its_own_log_when_asked(ranks4):
    """What ``logs`` asks of a rank whose file is not on the notebook's host."""
    ranks4.execute("print('own log line')", timeout=30)
    (excerpt,) = ranks4.apply(rpc.handle, rpc.ReadLog(tail=1), ranks=[1], timeout=30)
    assert excerpt.lines[-1][1] == "own log line"
    assert os.path.samefile(excerpt.path, rank_logs.path(ranks4.state_dir(), 1))
    (found,) = ranks4.apply(rpc.handle, rpc.ReadLog(grep=r"^own log"), ranks=[2], timeout=30)
    assert found.matched >= 1 and re.fullmatch("own log line", found.lines[-1][1])
