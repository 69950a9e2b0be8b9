"""Tier 1: output grouped by rank ranges (dshbak -c style) and stacks merged for ``where``."""

from workbench.notebook.cluster import grouping
from workbench.notebook.commands.where import format_where

STACK = """Thread 0x01 (most recent call first):
  File "/x/torch/distributed/distributed_c10d.py", line 2801 in all_reduce
  File "/home/u/train.py", line 412 in step
"""
LOADER = """Thread 0x02 (most recent call first):
  File "/x/torch/utils/data/dataloader.py", line 630 in __next__
  File "/home/u/train.py", line 405 in step
"""


def test_labels_compact_rank_ranges():
    assert grouping.label([3]) == "rank 3"
    assert grouping.label([15, 0, 1, 2, 13, 3]) == "ranks 0-3,13,15"
    assert grouping.tag_ranks([0, 1, 2], "a\nb") == "[ranks 0-2] a\n[ranks 0-2] b\n"


def test_identical_values_grouped_in_first_seen_order():
    items = [(0, "x"), (1, "y"), (2, "x"), (3, "x"), (4, "y"), (5, "z")]
    assert grouping.group_identical(items) == [([0, 2, 3], "x"), ([1, 4], "y"), ([5], "z")]
    by_len = grouping.group_identical([(0, "ab"), (1, "cd"), (2, "e")], key=len)
    assert by_len == [([0, 1], "ab"), ([2], "e")]


def test_grouping_is_the_default_only_past_the_threshold_and_either_way_on_request():
    n = grouping.GROUP_PAST
    assert not grouping.resolve(None, n) and grouping.resolve(None, n + 1)
    assert grouping.resolve(True, 2) and not grouping.resolve(False, 1024)


def test_where_at_1024_ranks_is_one_grouped_answer():
    stacks = {r: (LOADER if r >= 1022 else STACK) for r in range(1024)}
    stacks[7] = "process 4242 is stopped (SIGSTOP): it cannot run; `kill -CONT 4242` resumes it"
    text = format_where(stacks)
    lines = text.splitlines()
    assert lines[0] == "3 place(s) for 1024 ranks:"
    assert lines[1].startswith("  ranks 0-6,8-1021: ") and "in all_reduce" in lines[1]
    assert lines[2].startswith("  ranks 1022-1023: ") and "in __next__" in lines[2]
    assert lines[3].startswith("  rank 7: process 4242 is stopped")
    assert '[ranks 0-6,8-1021]   "/home/u/train.py", line 412 in step' in text
    assert len(lines) < 20  # one answer, not 1024 stacks
    per_rank = format_where({0: STACK, 1: STACK}, group=False)
    assert per_rank.splitlines()[0].startswith("[rank 0] ") and "[rank 1] " in per_rank


def test_where_groups_a_cell_whose_file_differs_only_by_each_ranks_kernel_pid():
    cell = (
        "Thread 0x{t:x} (most recent call first):\n"
        '  File "/tmp/ipykernel_{pid}/3052660847.py", line 3 in wait_here\n'
        '  File "/tmp/ipykernel_{pid}/3052660847.py", line 5 in <module>\n'
    )
    stacks = {r: cell.format(t=0x7F00 + r, pid=26000 + r) for r in range(16)}
    lines = format_where(stacks).splitlines()
    assert lines[:2] == [
        "1 place(s) for 16 ranks:",
        '  ranks 0-15: "/tmp/ipykernel_<pid>/3052660847.py", line 3 in wait_here',
    ]
    # one rank at a time keeps its own file
    assert "/tmp/ipykernel_26001/" in format_where(stacks, group=False)


def test_a_cells_end_shows_each_distinct_output_and_traceback_once(capsys):
    from workbench.notebook.cluster.cell import show_grouped

    ranks = list(range(16))
    rest = [("loss 1.0\n" if r != 5 else "loss nan\n", "") for r in ranks]
    failures = {r: ("ValueError", "bad", "ValueError: bad batch") for r in (1, 2, 3)}
    failures[9] = ("KeyError", "9", "KeyError: 9")
    show_grouped(ranks, rest, [[] for _ in ranks], [None] * 16, failures, skip=(2,))
    out, err = capsys.readouterr()
    assert out.splitlines() == ["[ranks 0-4,6-15] loss 1.0", "[rank 5] loss nan"]
    assert err.splitlines() == ["[ranks 1,3] ValueError: bad batch", "[rank 9] KeyError: 9"]
