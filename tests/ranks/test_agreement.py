"""The ranks' per-step agreement: the shared-memory board, and the gloo path it replaces
where ranks are on several hosts (both on real ranks)."""

import math
import os

import pytest

from workbench.engine.agreement import Board


@pytest.fixture
def board_path():
    path = Board.create(2)
    try:
        yield path
    finally:
        os.unlink(path)


def test_board_gives_every_rank_row_in_rank_order_across_slot_reuse(board_path):
    b0, b1 = Board(board_path, 0, 2), Board(board_path, 1, 2)
    for n in range(1, 11):  # more agreements than slots: slots are reused
        b1.post(42, n, [n + 0.5, 1, 0])  # the later rank posts first: order does not matter
        b0.post(42, n, [n + 0.25, 0, n])
        for board in (b0, b1):
            rows = board.collect(42, n, timeout=1)
            assert [r[:3] for r in rows] == [(n + 0.25, 0.0, float(n)), (n + 0.5, 1.0, 0.0)]
    b0.close()
    b1.close()


def test_board_never_takes_a_stale_torn_or_other_generation_row(board_path):
    b0, b1 = Board(board_path, 0, 2), Board(board_path, 1, 2)
    b0.post(7, 1, [1.0])
    b1.post(6, 1, [1.0])  # a previous trainer's row in the same slot
    with pytest.raises(RuntimeError, match=r"rank 0: rank\(s\) \[1\] did not reach agreement 1"):
        b0.collect(7, 1, timeout=0.2)
    b1.post(7, 1, [float("nan"), 1])
    rows = b0.collect(7, 1, timeout=1)
    assert math.isnan(rows[1][0]) and rows[1][1] == 1.0  # a NaN loss is a value like any other
    # a row changed after it was written (half-written, or its stores seen out of order) fails its CRC
    off = b1._offset(1, 1) + 8 * 3
    b1._mm[off : off + 1] = bytes([b1._mm[off] ^ 0xFF])
    with pytest.raises(RuntimeError, match=r"\[1\] did not reach"):
        b0.collect(7, 1, timeout=0.2)
    b0.post(7, 5, [2.0])  # agreement 5 reuses agreement 1's slot
    with pytest.raises(RuntimeError, match=r"\[1\] did not reach agreement 5"):
        b0.collect(7, 5, timeout=0.2)
    with pytest.raises(ValueError, match="at most 8 values"):
        b0.post(7, 2, list(range(9)))
    b0.close()
    b1.close()


def test_board_says_which_peer_is_gone_instead_of_waiting_on(board_path):
    import struct
    import subprocess
    import sys

    b0, b1 = Board(board_path, 0, 2), Board(board_path, 1, 2)
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a process that was rank 1 and has exited (killed, out of memory)
    b1._mm[8:16] = struct.pack("d", child.pid)
    b0.post(9, 1, [0.5])
    with pytest.raises(RuntimeError, match=rf"rank 0: rank 1 \(pid {child.pid}\) is gone: agreement 1"):
        b0.collect(9, 1, timeout=60)
    b0.close()
    b1.close()


def _both_transports(rank_flags, loss):
    """On each rank: the same sequence of agreements through the board and through gloo."""
    from workbench.engine import agreement

    ch = agreement.channel()
    out = {}
    for name, channel in (("board", ch), ("gloo", agreement.gloo_channel())):
        a = agreement.Agreement(channel, generation=123456789 + len(out), world_size=2)
        pending = a.with_loss(rank_flags, loss)
        flags, mean, _ = pending.result()
        later = a.flags(agreement.Flags(pause=1))[0]
        out[name] = (channel.transport, flags._asdict(), mean, later._asdict())
    return out


def _on_rank():
    from workbench.engine import runtime

    r = runtime.context().rank
    from workbench.engine.agreement import Flags

    return _both_transports(Flags(stop=0, pause=r, version=3 - r, reason=0, hooks_due=r), float(r + 1)), sorted(
        os.listdir("/dev/shm")
    )


def test_shared_memory_and_gloo_agree_alike_on_real_ranks(ranks2):
    (r0, shm0), (r1, _) = ranks2.apply(_on_rank)
    for res in (r0, r1):
        assert res["board"][0] == "shared memory" and res["gloo"][0] == "gloo"
        for name in ("board", "gloo"):
            _, flags, mean, later = res[name]
            # each flag the maximum over the ranks, read back by its name
            assert flags == {"stop": 0, "pause": 1, "version": 3, "reason": 0, "hooks_due": 1}, name
            assert mean == 1.5 and later == {"stop": 0, "pause": 1, "version": 0, "reason": 0, "hooks_due": 0}, name
    assert not [f for f in shm0 if f.startswith("workbench-agreement")]  # unlinked once opened everywhere
