"""Fault drills on real gloo ranks: a killed rank, a kill during a save, a stopped rank, a NaN.

Kill tests use private rank sets (``fresh_ranks``, which checks by pid that nothing is
left behind); the SIGSTOP and NaN drills use the shared sets and leave them clean.
"""

from __future__ import annotations

import math
import os
import signal
import time

import pytest
from conftest import clean_trainer

import workbench
from workbench.notebook import api, stream
from workbench.notebook import checkpoints as ck
from workbench.notebook.cluster import RankDied
from workbench.notebook.commands.where import format_where, where_ranks
from workbench.shared.checkpoint import catalog

TRAINER_SETUP = """
import time
from workbench.engine import control, trainer as _tr
control.build_default("ddp")
_rec = {}
_tr.current().add_hook(lambda r: _rec.__setitem__(r["step"], r["loss"]))
"""
SLOW = "_tr.current().add_hook(lambda r: time.sleep(0.15))"


def close(a, b, rel=1e-5):
    return abs(a - b) <= rel * max(abs(a), abs(b), 1e-12)


def wait_for(pred, timeout, what):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def trainer_step(rs) -> int:
    from workbench.engine import control

    return min(s["step"] for s in rs.apply(control.status))


def test_sigkill_one_of_4_mid_training_then_resume_matches_uninterrupted(fresh_ranks, tmp_path):
    from workbench.engine import control

    root = str(tmp_path)
    rs = fresh_ranks(4)
    rs.execute(TRAINER_SETUP, timeout=120)  # the uninterrupted reference run
    rs.apply(control.start, 12)
    rs.apply(control.wait, 120)
    ref = rs.pull("_rec")[0]
    assert sorted(ref) == list(range(1, 13))

    rs.execute(TRAINER_SETUP + SLOW, timeout=120)  # same seed, slowed so the kill lands mid-run
    ck.autosave(3, keep=5, async_=True, root=root)
    rs.apply(control.start, 12)
    wait_for(lambda: trainer_step(rs) >= 7, 60, "step 7")
    rs.signal_rank(2, signal.SIGKILL)
    wait_for(lambda: rs.dead(), 1.0, "the death to be detected")
    dead = rs.dead()
    assert dead[0]["rank"] == 2 and dead[0]["pid"] == rs.procs[2].pid
    # the exit status is read from the launcher (health.RankProcess.exit_code waits for it)
    assert dead[0]["exit"] == "killed by SIGKILL" and dead[0]["exit_code"] == -9, dead[0]

    info = workbench.restart(load="latest", setup=TRAINER_SETUP, dir=root)  # restart + rebuild + load latest
    start = info["step"]
    # the newest COMPLETE auto-save: 6 or 9, or 3 when the async save of step 6 was still being
    # written at the kill (then it never became visible)
    assert start in (3, 6, 9) and info["restarted"] == 4 and api.current() is not rs
    rs2 = api.current()
    assert trainer_step(rs2) == start
    rs2.apply(control.start, 12 - start)
    rs2.apply(control.wait, 120)
    got = rs2.pull("_rec")[0]
    assert sorted(got) == list(range(start + 1, 13))
    for s in got:
        assert close(got[s], ref[s]), (s, got[s], ref[s])
    ck.autosave(None)


SETUP = """
import torch
from workbench.models import GPT, GPTConfig, SyntheticDataset, batch_at
from workbench.strategies import prepare
from workbench.engine import checkpoint_hooks as ch
torch.manual_seed(0)
_prep = prepare(GPT(GPTConfig.tiny()), lambda ps: torch.optim.AdamW(ps, lr=1e-2), "ddp")
_state = ch.track(_prep)
_ds = SyntheticDataset("copy", n=256, seq_len=16)
_losses = {}
def _train(n):
    for _ in range(n):
        s = _state.step
        _losses[s] = _prep.train_step(batch_at(_ds, 8, s, dp_rank=_prep.dp_rank, dp_size=_prep.dp_size))
        ch.step_done(_losses[s])
"""
DRILL = "from workbench.engine.checkpoint import save as _S; _S.DRILL['after_parts'] = 60.0"


def parts_written(root: str) -> bool:
    return any(".tmp-" in n and os.path.exists(os.path.join(root, n, ".metadata")) for n in os.listdir(root))


def test_kill_during_sync_save_and_during_async_save_keeps_latest(fresh_ranks, tmp_path):
    from workbench.engine import rpc

    root = str(tmp_path)
    rs = fresh_ranks(2)
    rs.execute(SETUP + "_train(3)", timeout=120)
    ck.save(root=root, rankset=rs)  # the good one: step 3
    rs.execute("_train(1)", timeout=60)
    ref = rs.pull("_losses")[0]  # ref[3]: the loss of step 3 from the good checkpoint's weights

    # 1. sync save: every part on disk, then rank 1 is killed before the commit
    rs.execute(DRILL, timeout=30)
    call = rs.submit(rpc.handle, rpc.SaveCheckpoint(root=root))
    wait_for(lambda: parts_written(root), 60, "the save's parts")
    rs.signal_rank(1, signal.SIGKILL)
    with pytest.raises(RankDied, match=r"rank 1 .* killed by SIGKILL"):
        call.result(timeout=30)
    assert [m.step for _, m in catalog.entries(root)] == [3]
    info = workbench.restart(load="latest", setup=SETUP, dir=root)
    assert info["step"] == 3
    rs = api.current()
    rs.execute("_train(1)", timeout=60)
    assert close(rs.pull("_losses")[0][3], ref[3])

    # 2. async save: training goes on, then rank 0 (the committer) is killed mid-save
    rs.execute(DRILL, timeout=30)
    out = ck.save(async_=True, root=root, rankset=rs)
    assert out["async"] and "save_s" not in out
    wait_for(lambda: parts_written(root), 60, "the async save's parts")
    rs.signal_rank(0, signal.SIGKILL)
    wait_for(lambda: rs.dead(), 1.0, "the death to be detected")
    assert [(d["rank"], d["exit"]) for d in rs.dead()] == [(0, "killed by SIGKILL")]
    assert catalog.resolve(root, "latest")[1].step == 3
    info = workbench.restart(load="latest", dir=root)  # the setup is remembered
    assert info["step"] == 3
    api.current().execute("_train(2)", timeout=60)
    got = api.current().pull("_losses")[0]
    assert close(got[3], ref[3]) and all(v == v for v in got.values())
    assert [os.path.basename(f) for f, _ in catalog.entries(root)] == ["step-00000003"]


LOOP = """
import time, torch, torch.distributed as dist
_t = torch.ones(1)
for _i in range(500):
    dist.all_reduce(_t)
    time.sleep(0.01)
del _t, _i
"""


def test_sigstop_one_of_4_diagnosis_within_timeout_plus_5s(fresh_ranks):
    """A rank stopped (SIGSTOP) in a collective loop: every rank's stack, the stopped one named.

    A private set: ipyparallel's controller drops an engine that misses heartbeats for
    1.5 s, so a stopped rank cannot rejoin its set (it is killed at the end).
    """
    rs = fresh_ranks(4)
    call = rs.execute_async(LOOP)
    time.sleep(1.0)
    pid = rs.procs[2].pid
    os.kill(pid, signal.SIGSTOP)
    try:
        timeout = 3.0
        t0 = time.monotonic()
        assert not call.wait(timeout)  # stuck: rank 2 cannot run, the others wait in all_reduce
        diag = where_ranks(rankset=rs, wait=2.0)  # what `%distrain where` prints
        elapsed = time.monotonic() - t0
        assert elapsed <= timeout + 5, elapsed
        assert sorted(diag) == [0, 1, 2, 3]
        assert "stopped (SIGSTOP)" in diag[2]
        for r in (0, 1, 3):
            assert "all_reduce" in diag[r], diag[r][:2000]
        text = format_where(diag)
        assert "[rank 2] process" in text and "stopped" in text and "all_reduce" in text
    finally:
        os.kill(pid, signal.SIGCONT)


def test_nan_pauses_then_rollback_to_last_good_checkpoint(ranks2, tmp_path):
    from workbench.engine import control

    rs, root = ranks2, str(tmp_path)
    store = stream.attach(rs).store
    before = (store.rollbacks, store.duplicates)
    try:
        rs.apply(control.build_default, "ddp")
        ck.autosave(2, keep=3, async_=False, root=root, rankset=rs)
        rs.apply(control.start, 6)
        rs.apply(control.wait, 60)
        rs.apply(control.inject, "nan")
        rs.apply(control.start, 4)
        wait_for(lambda: {s["state"] for s in rs.apply(control.status)} == {"paused"}, 60, "the NaN pause")
        st = rs.apply(control.status)[0]
        assert st["step"] == 7 and "non-finite" in st["reason"]
        assert catalog.resolve(root)[1].step == 6  # the NaN step was not auto-saved
        hint = ck.rollback_hint(7, float("nan"), root=root)
        assert "NaN/Inf" in hint and "`%distrain ckpt load latest`" in hint and "step 6" in hint
        info = ck.load("latest", root=root, rankset=rs)
        assert info["step"] == 6 and trainer_step(rs) == 6
        rs.apply(control.request, "resume")
        states = rs.apply(control.wait, 60)
        assert {s["state"] for s in states} == {"finished"} and states[0]["step"] == 10
        # the notebook shows the run as it now stands: steps 7.. re-run, the NaN step set aside
        run = states[0]["run"]
        assert store.wait(lambda s: s.last_steps(run) == {0: 10, 1: 10}, 10)
        assert (store.rollbacks, store.duplicates) == (before[0] + 2, before[1])  # once per rank
        loss = [r["loss"] for r in store.snapshot_rows(run) if r["rank"] == 0 and r["source"] == "trainer"]
        assert len(loss) == 10 and all(math.isfinite(v) for v in loss)
        assert any(r["step"] == 7 and math.isnan(r["loss"]) for r in store.superseded if r["run"] == run)
    finally:
        rs.apply(clean_trainer, timeout=60)
