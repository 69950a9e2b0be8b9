"""The hang report's conclusion (``cluster.culprit``) from flight records and stacks as the ranks
write them: the rank the others wait for named with its place in the user's code, in one line
at 64 ranks; a mismatched collective named as one; several culprits each with its place; the
stacks alone where no rank keeps a record. And the flight record's file read back as written."""

import mmap
import os

from workbench.notebook.cluster import culprit
from workbench.shared import flight

NOW = 1_000_000.0
CELL = "/tmp/ipykernel_4242/2823142709.py"


def dump(*frames: str) -> str:
    """A faulthandler dump of a rank: the cell's thread (innermost first) under the kernel's frames."""
    body = "".join(f'  File "{f}\n' for f in frames)
    kernel = '  File "/v/lib/python3.11/site-packages/ipykernel/kernelbase.py", line 1 in dispatch\n' * 6
    return f'Thread 0x1 (most recent call first):\n  File "/usr/lib/python3.11/threading.py", line 320 in wait\n\nCurrent thread 0x2 (most recent call first):\n{body}{kernel}'


IN_ALL_REDUCE = dump(
    '/v/lib/python3.11/site-packages/torch/distributed/distributed_c10d.py", line 3252 in all_reduce',
    '/w/workbench/engine/comm_timing.py", line 203 in timed',
    f'{CELL}", line 11 in <module>',
)
IN_LOADER = dump(f'{CELL}", line 5 in load_next_batch', f'{CELL}", line 10 in <module>')
IN_SAVE = dump(
    '/usr/lib/python3.11/queue.py", line 180 in get',
    '/v/lib/python3.11/site-packages/torch/utils/data/dataloader.py", line 630 in __next__',
    '/home/u/project/ckpt.py", line 17 in save',
    f'{CELL}", line 9 in <module>',
)


def rec(seq, op="all_reduce", *, inside=False, group="world", dtype="float32", shape="4", numel=4, entered=NOW - 10):
    return flight.Record(seq, op, group, dtype, shape, numel * 4, numel, entered, 0.0 if inside else entered + 0.01)


def history(n: int, *, last_inside: bool = True, op: str = "all_reduce") -> list[flight.Record]:
    """Collectives #1..#n on the world group, the last one still running where ``last_inside``."""
    return [rec(i) for i in range(1, n)] + [rec(n, op, inside=last_inside)]


def places(stacks: dict[int, str], cell: str = CELL.rsplit("/", 1)[1]) -> dict[int, culprit.Place]:
    """Each rank's place, the cell running being the one of ``CELL``."""
    return {r: culprit.place_of(s, cell=cell) for r, s in stacks.items()}


def test_the_rank_that_never_entered_is_named_with_its_cell_line_in_one_line_at_64_ranks():
    records = {r: history(12) for r in range(64)}
    records[2] = history(11, last_inside=False)
    stacks = {r: IN_ALL_REDUCE for r in range(64)}
    stacks[2] = IN_LOADER
    v = culprit.conclude(records, places(stacks), 64, now=NOW)
    assert v.text == (
        "ranks 0-1,3-63 wait in all_reduce #12 (group world) for 10.0 s; "
        "rank 2 never entered it: it is in load_next_batch (cell line 5)"
    )
    assert v.culprits == [2] and len(v.waiting) == 63 and not v.mismatch


def test_one_rank_all_gathering_while_the_others_all_reduce_is_a_mismatch():
    records = {r: history(5) for r in range(4)}
    records[2] = [rec(i) for i in range(1, 5)] + [rec(5, "all_gather", inside=True, shape="4*4", numel=16)]
    v = culprit.conclude(records, places({r: IN_ALL_REDUCE for r in range(4)}), 4, now=NOW)
    assert v.mismatch
    assert v.text == (
        "mismatched collective #5 (group world): ranks 0-1,3 call all_reduce float32[4]; "
        "rank 2 calls all_gather 4 x float32[4]"
    )


def test_sizes_that_differ_at_one_sequence_number_are_a_mismatch_too():
    records = {r: history(3) for r in range(2)}
    records[1] = [rec(1), rec(2), rec(3, inside=True, shape="8", numel=8)]
    v = culprit.conclude(records, places({0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE}), 2, now=NOW)
    assert (
        v.mismatch and "rank 0 calls all_reduce float32[4]" in v.text and "rank 1 calls all_reduce float32[8]" in v.text
    )


def test_two_ranks_stuck_in_two_places_are_both_named():
    records = {r: history(7) for r in range(4)}
    records[1] = records[2] = history(6, last_inside=False)
    stacks = {0: IN_ALL_REDUCE, 1: IN_LOADER, 2: IN_SAVE, 3: IN_ALL_REDUCE}
    v = culprit.conclude(records, places(stacks), 4, now=NOW)
    assert v.culprits == [1, 2]
    assert v.text == (
        "ranks 0,3 wait in all_reduce #7 (group world) for 10.0 s; ranks 1-2 never entered it: "
        "rank 1 is in load_next_batch (cell line 5); rank 2 is in save (ckpt.py line 17)"
    )


def test_ranks_at_one_place_are_one_group_and_a_stopped_rank_says_so():
    records = {r: history(3) for r in range(16)}
    for r in (4, 5, 6):
        records[r] = history(2, last_inside=False)
    stacks = {r: IN_ALL_REDUCE for r in range(16)}
    stacks.update({4: IN_LOADER, 5: IN_LOADER, 6: "process 77 is stopped (SIGSTOP): it cannot run"})
    v = culprit.conclude(records, places(stacks), 16, now=NOW)
    assert v.text.startswith(
        "ranks 0-3,7-15 wait in all_reduce #3 (group world) for 10.0 s; ranks 4-6 never entered it: "
    )
    assert "ranks 4-5 are in load_next_batch (cell line 5)" in v.text
    assert "rank 6: process 77 is stopped (SIGSTOP)" in v.text


def test_a_subgroup_counts_its_own_members_only():
    group = flight.group_label([2, 3])
    records = {r: [rec(1)] for r in range(4)}
    records[2] = [rec(1), rec(1, group=group, inside=True)]
    stacks = {0: IN_LOADER, 1: IN_LOADER, 2: IN_ALL_REDUCE, 3: IN_SAVE}
    v = culprit.conclude(records, places(stacks), 4, now=NOW)
    assert v.text == (
        "rank 2 waits in all_reduce #1 (group ranks 2-3) for 10.0 s; rank 3 never entered it: it is in save (ckpt.py line 17)"
    )
    assert v.culprits == [3]


def test_without_records_the_stacks_say_who_is_in_a_collective():
    stacks = {0: IN_ALL_REDUCE, 1: IN_ALL_REDUCE, 2: IN_LOADER}
    v = culprit.conclude({0: None, 1: None, 2: None}, places(stacks), 3, now=NOW)
    assert v.text == (
        "ranks 0-1 wait in all_reduce (by their stacks); rank 2 is not in one: it is in load_next_batch (cell line 5)"
    )
    assert v.culprits == [2]


def test_no_conclusion_when_no_rank_waits():
    records = {r: history(3, last_inside=False) for r in range(2)}
    assert culprit.conclude(records, places({0: IN_LOADER, 1: IN_LOADER}), 2, now=NOW).text == ""


def test_a_frame_of_this_cell_an_earlier_cell_and_a_module():
    this = CELL.rsplit("/", 1)[1]
    assert culprit.describe_frame(f'"{CELL}", line 5 in load_next_batch', this) == "in load_next_batch (cell line 5)"
    assert culprit.describe_frame(f'"{CELL}", line 3 in <module>', this) == "at cell line 3"
    other = '"/tmp/ipykernel_1/99.py", line 4 in helper'
    assert culprit.describe_frame(other, this) == "in helper (line 4 of an earlier cell)"
    assert culprit.describe_frame('"/home/u/data.py", line 12 in load', this) == "in load (data.py line 12)"
    assert culprit.describe_frame(other) == "in helper (line 4 of a cell)"  # which cell is not known
    assert culprit.cell_file_name("x = 1\n") != culprit.cell_file_name("x = 2\n")


def test_an_idle_rank_is_idle_and_a_comprehension_is_named_by_its_function():
    idle = dump()
    assert culprit.place_of(idle).state == "idle (no cell running)"
    comp = dump(f'{CELL}", line 6 in <listcomp>', f'{CELL}", line 6 in gather', f'{CELL}", line 9 in <module>')
    assert culprit.place_of(comp).user == "in gather (line 6 of a cell)"


def test_the_flight_file_reads_back_what_was_written_and_skips_the_slot_being_rewritten(tmp_path):
    path = tmp_path / "rank3.flight"
    path.write_bytes(b"\0" * flight.FILE_SIZE)
    with open(path, "r+b") as fh:
        mm = mmap.mmap(fh.fileno(), flight.FILE_SIZE)
    flight.HEADER.pack_into(mm, 0, flight.MAGIC, flight.VERSION, flight.SLOTS, 3, os.getpid(), 0)
    total = flight.SLOTS + 5
    for n in range(total):
        flight.RECORD.pack_into(
            mm,
            flight.HEADER_SIZE + (n % flight.SLOTS) * flight.RECORD.size,
            n + 1,
            NOW + n,
            0.0 if n == total - 1 else NOW + n + 0.5,
            16,
            4,
            flight.clip("all_reduce", 16),
            flight.clip(flight.group_label([0, 1, 2, 5]), 32),
            b"float32",
            b"4",
            -1,
            0,
        )
        flight.COUNT.pack_into(mm, flight.COUNT_OFFSET, n + 1)
    mm.flush()
    records = flight.read(str(tmp_path), 3)
    assert len(records) == flight.SLOTS - 1  # the oldest slot may be half rewritten: left out
    assert [r.seq for r in records] == list(range(total - flight.SLOTS + 2, total + 1))
    last = records[-1]
    assert last.inside and last.op == "all_reduce" and last.group == "ranks 0-2,5" and last.payload() == "float32[4]"
    assert flight.members(last.group) == [0, 1, 2, 5] and flight.members("ranks 0-3,3+") is None
    assert flight.read(str(tmp_path), 4) is None  # a rank without a record
