"""Tier 2: the shared live rank sets (real ipyparallel engines, gloo).

The ranks import this module for the functions applied on them (by reference): it imports
nothing of the notebook side at its top, which tests/ranks/test_worked_ranks.py would find there."""

import time

import pytest


def _all_reduce_rank_plus_one():
    import torch
    import torch.distributed as dist

    from workbench import engine

    t = torch.tensor([float(engine.rank + 1)])
    dist.all_reduce(t)
    return t.item()


@pytest.mark.parametrize("fixture", ["ranks2", "ranks4"])
def test_all_reduce_gives_the_sum_on_every_rank(fixture, request):
    rs = request.getfixturevalue(fixture)
    n = rs.world_size
    assert rs.apply(_all_reduce_rank_plus_one) == [n * (n + 1) / 2] * n


def test_ranks_know_themselves(ranks4):
    def me():
        import os

        import torch

        from workbench import engine

        return (
            engine.rank,
            engine.world_size,
            engine.local_rank,
            engine.local_world_size,
            engine.device,
            os.environ["RANK"],
            os.environ["MASTER_PORT"] != "",
            torch.get_num_threads(),
        )

    rows = ranks4.apply(me)
    assert [r[0] for r in rows] == [0, 1, 2, 3]
    assert {r[1] for r in rows} == {4}
    assert [r[2] for r in rows] == [0, 1, 2, 3] and {r[3] for r in rows} == {4}
    assert {r[4] for r in rows} == {"cpu"}
    assert [r[5] for r in rows] == ["0", "1", "2", "3"]
    assert all(r[6] for r in rows) and {r[7] for r in rows} == {1}


def test_state_persists_between_cells_per_rank(ranks4):
    ranks4.execute("from workbench import engine\nmine = engine.rank * 7")
    ranks4.execute("mine += 1")
    assert ranks4.pull("mine") == [1, 8, 15, 22]


def test_subset_of_ranks(ranks4):
    ranks4.execute("touched = False")
    ranks4.execute("touched = True", ranks="0,2-3")
    assert ranks4.pull("touched") == [True, False, True, True]
    assert ranks4.pull("touched", ranks="1") == [False]


def test_failure_names_the_rank(ranks4):
    from workbench.notebook.cluster import RankFailure

    with pytest.raises(RankFailure) as err:
        ranks4.execute("from workbench import engine\nif engine.rank == 2: raise ValueError('bad shard')")
    assert err.value.ranks == [2]
    assert "rank 2: ValueError: bad shard" in str(err.value)
    assert ranks4.apply(_all_reduce_rank_plus_one) == [10.0] * 4  # ranks still usable


def test_push_and_pull(ranks2):
    ranks2.push({"lr": 3e-4, "cfg": {"layers": 2}})
    assert ranks2.pull("lr") == [3e-4, 3e-4]
    assert ranks2.pull("cfg", ranks="1") == [{"layers": 2}]


def test_interrupt_stops_a_busy_loop_on_every_rank(ranks4):
    call = ranks4.execute_async("spins = 0\nwhile True:\n    spins += 1")
    time.sleep(1.0)
    assert not call.ar.ready()
    ranks4.interrupt()
    assert call.wait(10), "the ranks did not stop after SIGINT"
    assert sorted(call.failures()) == [0, 1, 2, 3]
    assert {f[0] for f in call.failures().values()} == {"KeyboardInterrupt"}
    assert all(s > 0 for s in ranks4.pull("spins"))
    assert ranks4.apply(_all_reduce_rank_plus_one) == [10.0] * 4


def test_status_while_a_rank_is_busy(ranks4):
    call = ranks4.execute_async("import time\ntime.sleep(1.5)", ranks="3")
    time.sleep(0.3)
    rows = ranks4.status()
    assert [r["state"] for r in rows] == ["idle", "idle", "idle", "busy"]
    assert all(r["pid"] and r["host"] and r["memory_mb"] > 0 and r["device"] == "cpu" for r in rows)
    call.result(timeout=10)
    assert [r["state"] for r in ranks4.status()] == ["idle"] * 4


def test_helpers_give_way_to_the_ranks(ranks2):
    """The controller (once the ranks registered) runs at the background priority; a rank's
    threads keep theirs, its event sender included (it shares the GIL with training: a
    lowered thread preempted while holding it would hold up the step)."""
    import os

    from workbench.notebook import background

    def nices(pid):
        return {os.getpriority(os.PRIO_PROCESS, int(t)) for t in os.listdir(f"/proc/{pid}/task")}

    baseline = os.getpriority(os.PRIO_PROCESS, 0)  # what this test run was started with
    lowered = max(background.NICE, baseline)
    controller = ranks2._controller_pids()
    assert controller and all(nices(pid) == {lowered} for pid in controller)

    def on_rank():  # the threads' nice values read here: a rank imports nothing of the notebook side
        import os
        import threading

        from workbench.engine import publisher

        sender = publisher.get()._thread
        return tuple(os.getpriority(os.PRIO_PROCESS, t.native_id) for t in (sender, threading.main_thread()))

    from workbench.notebook import stream

    stream.attach(ranks2)  # the ranks' event senders connect
    assert ranks2.apply(on_rank) == [(baseline, baseline)] * 2


def _parent_and_draws():
    import os
    import random

    import numpy as np

    return os.getppid(), float(np.random.random()), random.random()


def test_local_ranks_are_forked_by_one_process_yet_draw_their_own_random_numbers(ranks2):
    """Local ranks share one torch import (forked by ``workbench.engine.preload``); a fork
    must not leave them with one random state, as separate processes never had."""
    import os

    rows = ranks2.apply(_parent_and_draws)
    assert {r[0] for r in rows} == {ranks2.forked.pid} and ranks2.forked.pid != os.getpid()
    assert rows[0][1] != rows[1][1], "numpy's global random state is shared by the forks"
    assert rows[0][2] != rows[1][2], "random's state is shared by the forks"


def _pid_and_session():
    import os

    return os.getpid(), os.getsid(0)


def test_local_ranks_each_lead_their_own_session(ranks2):
    """As ``torchrun`` starts its workers: Linux's scheduler groups processes by session
    (autogroups), and ranks sharing one session made gloo's loops spin twice as much on a
    4-stage pipeline (benchmarks/FINDINGS.md)."""
    rows = ranks2.apply(_pid_and_session)
    assert all(pid == sid for pid, sid in rows), rows
