"""Checkpoints that never half-load, on real gloo ranks and real files.

A damaged checkpoint (truncated shard, flipped byte, deleted shard, deleted manifest) is
refused naming the file, the rank that reads it and what is wrong, with every rank's
model, optimizer, step, data position and RNG exactly as before; the newest good one
then loads. Storage faults at save (a full disk, a read-only folder: real tmpfs mounts
the test makes and unmounts) cost a message, never a partial folder or the previous
``latest``; an auto-saving run trains on through a failed save and the dashboard says so.
The shared 2-rank set is used throughout; only the drill that gives a rank a private
folder and then kills it mid-load starts its own.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import time

import pytest
from conftest import clean_trainer

from workbench.engine import rpc
from workbench.notebook import checkpoints as ck
from workbench.notebook import session, stream, training
from workbench.notebook.cluster import RankDied
from workbench.notebook.commands import UsageError, dispatch
from workbench.shared.checkpoint import catalog
from workbench.shared.checkpoint.integrity import DamagedCheckpoint

BUILD = """
import hashlib, random, numpy as np, torch
from workbench.models import GPT, GPTConfig, SyntheticDataset, batch_at
from workbench.strategies import prepare
from workbench.engine import checkpoint_hooks as ch
torch.manual_seed(0)
_ci_model = GPT(GPTConfig.tiny())
_ci_prep = prepare(_ci_model, lambda ps: torch.optim.AdamW(ps, lr=1e-2), "ddp")
_ci_state = ch.track(_ci_prep)
_ci_ds = SyntheticDataset("copy", n=256, seq_len=16)
def _ci_train(n):
    for _ in range(n):
        s = _ci_state.step
        loss = _ci_prep.train_step(batch_at(_ci_ds, 8, s, dp_rank=_ci_prep.dp_rank, dp_size=_ci_prep.dp_size))
        ch.step_done(loss, data={"micro_batch": s + 1})
def _ci_fp():
    def digest(tensors):
        h = hashlib.sha256()
        for k, v in tensors:
            h.update(str(k).encode())
            h.update(v.detach().cpu().contiguous().numpy().tobytes() if torch.is_tensor(v) else repr(v).encode())
        return h.hexdigest()
    opt = _ci_prep.optimizer.state_dict()
    rng = hashlib.sha256(torch.get_rng_state().numpy().tobytes() + repr(random.getstate()).encode()
                         + np.random.get_state()[1].tobytes()).hexdigest()
    return {"model": digest(sorted(_ci_model.state_dict().items())),
            "optim": digest([(f"{i}.{k}", v) for i, st in sorted(opt["state"].items()) for k, v in sorted(st.items())]),
            "lr": opt["param_groups"][0]["lr"], "step": _ci_state.step, "data": dict(_ci_state.data), "rng": rng}
"""
CLEAN = """
from workbench.engine import checkpoint_hooks as ch
from workbench.engine.checkpoint import save as _ci_save, load as _ci_load
_ci_save.wait(); _ci_save.DRILL['before_write'] = 0.0; _ci_load.DRILL['before_apply'] = 0.0
ch.untrack(); ch.set_autosave(None, None)
for _n in [n for n in list(globals()) if n.startswith('_ci_')]:
    del globals()[_n]
"""


@pytest.fixture
def rs(ranks2):
    yield ranks2
    ranks2.execute(CLEAN, timeout=60)


def fingerprint(rs):
    rs.execute("_ci_out = _ci_fp()", timeout=30)
    return rs.pull("_ci_out")


@contextlib.contextmanager
def tmpfs(path, size: str):
    """A real tmpfs of ``size`` mounted at ``path`` for the test, always unmounted after."""
    os.makedirs(path, exist_ok=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield str(path)
    finally:
        subprocess.run(["umount", "-l", str(path)], check=True)


def damage(folder, kind):
    if kind == "truncated":
        p = os.path.join(folder, "__1_0.distcp")
        os.truncate(p, os.path.getsize(p) // 2)
    elif kind == "flipped":
        with open(os.path.join(folder, "__0_0.distcp"), "r+b") as fh:
            fh.seek(os.path.getsize(fh.name) // 2)
            b = fh.read(1)
            fh.seek(-1, 1)
            fh.write(bytes([b[0] ^ 0x40]))
    elif kind == "deleted shard":
        os.remove(os.path.join(folder, "__1_0.distcp"))
    elif kind == "deleted manifest":
        os.remove(os.path.join(folder, "manifest.json"))


EXPECTED = {
    "truncated": r"__1_0\.distcp \(read by rank 1\) is truncated: [\d,]+ of [\d,]+ bytes",
    "flipped": r"__0_0\.distcp \(read by rank 0\) is corrupt \(checksum mismatch\)",
    "deleted shard": r"__1_0\.distcp \(read by rank 1\) is missing",
    "deleted manifest": r"manifest\.json \(read by rank 0\) is missing or invalid",
}


def test_damaged_checkpoints_are_refused_by_name_and_nothing_changes(rs, tmp_path):
    import re

    root = str(tmp_path / "ck")
    rs.execute(BUILD + "_ci_train(2)", timeout=120)
    ck.save(root=root, rankset=rs)  # step 2: the newest good one once step 4 is damaged
    rs.execute("_ci_train(2)", timeout=60)
    ck.save(root=root, rankset=rs)
    rs.execute("_ci_train(1)", timeout=60)
    folder = os.path.join(root, "step-00000004")
    pristine = str(tmp_path / "pristine")
    shutil.copytree(folder, pristine)
    assert {"__0_0.distcp", "__1_0.distcp"} <= set(os.listdir(folder))  # both ranks wrote a part
    before = fingerprint(rs)
    assert before[0]["step"] == 5 and before[0]["data"] == {"micro_batch": 5}

    for kind, pattern in EXPECTED.items():
        damage(folder, kind)
        with pytest.raises(DamagedCheckpoint) as err:
            ck.load("latest", root=root, rankset=rs)
        msg = str(err.value)
        assert re.search(pattern, msg), (kind, msg)
        assert "step-00000004 is damaged, nothing was loaded" in msg
        assert "newest good checkpoint is step-00000002: `%distrain ckpt load step-00000002`" in msg, msg
        assert fingerprint(rs) == before, kind  # model, optimizer, step, data position, RNG
        status = dict(zip(*[list(c) for c in (lambda df: (df["name"], df["status"]))(ck.list(root))]))
        assert status["step-00000004"].startswith("DAMAGED") and status["step-00000002"] == "good", status
        shutil.rmtree(folder)
        shutil.copytree(pristine, folder)

    # a damage the manifest was rewritten to match (checksums pass): DCP's read fails mid-load,
    # into staging storage, so still nothing changes
    from test_checkpoint_safety import reseal

    damage(folder, "truncated")
    reseal(folder)
    with pytest.raises(ck.LoadFailed, match=r"reading step-00000004 failed \(rank \d: .*\); nothing was applied"):
        ck.load("latest", root=root, rankset=rs)
    assert fingerprint(rs) == before

    shutil.rmtree(folder)
    shutil.copytree(pristine, folder)
    damage(folder, "deleted shard")
    info = ck.load("latest", root=root, rankset=rs, skip_damaged=True)  # as `restart --load` does
    assert info[
        "step"
    ] == 2 and "skipped step-00000004: damaged (__1_0.distcp (read by rank 1) is missing" in ck.describe_load(info)
    rs.execute("_ci_train(3)", timeout=60)
    info = ck.load("step-00000002", root=root, rankset=rs)  # the newest good one loads
    after = fingerprint(rs)
    assert info["step"] == 2 and [a["step"] for a in after] == [2, 2] and after[0]["data"] == {"micro_batch": 2}
    assert info["staging_bytes"] > 0


def test_verify_command_and_flags_that_would_be_ignored(rs, tmp_path, capsys):
    root = str(tmp_path)
    rs.execute(BUILD + "_ci_train(1)", timeout=120)
    ck.save(root=root, rankset=rs)
    good = ck.verify("latest", root=root, rankset=rs)
    assert good["problems"] == [] and good["ranks"] == 2 and good["checksums"]
    assert ck.describe_verify(good).startswith("step-00000001: good:")
    os.truncate(os.path.join(root, "step-00000001", "rank-00001.json"), 3)
    dispatch(f"ckpt verify 1 --dir {root}")  # what `%distrain ckpt verify 1` prints (no ranks needed)
    out = capsys.readouterr().out
    assert "rank-00001.json (read by rank 1) is truncated: 3 of" in out and "no good checkpoint" in out
    with pytest.raises(
        UsageError,
        match=r"`ckpt load` does not take --tag, --async \(--tag goes with save; "
        r"--async goes with save, autosave\); nothing was done",
    ):
        dispatch("ckpt load --tag x --async")
    with pytest.raises(UsageError, match="`ckpt list` does not take --keep"):
        dispatch("ckpt list --keep 2")
    with pytest.raises(UsageError, match="`ckpt autosave --off` takes no other flag"):
        dispatch("ckpt autosave --off --every 3")
    with pytest.raises(UsageError, match="unrecognized arguments: now"):
        dispatch("ckpt wait now")


def test_full_disk_and_read_only_folder_cost_a_message_not_latest(rs, tmp_path):
    rs.execute(BUILD + "_ci_train(1)", timeout=120)
    with tmpfs(tmp_path / "tiny", "200k") as root:  # refused before writing: both numbers named
        with pytest.raises(ck.SaveFailed) as err:
            ck.save(root=root, rankset=rs)
        msg = str(err.value)
        assert "checkpoint 'step-00000001' was not saved: it needs about" in msg and "MiB free" in msg
        assert "refused before writing" in msg and "`latest` is unchanged (there is none)" in msg
        assert os.listdir(root) == []

    with tmpfs(tmp_path / "small", "4m") as root:
        ck.save(root=root, rankset=rs)  # the good one
        rs.execute(
            "_ci_train(1); from workbench.engine.checkpoint import save as _ci_save; "
            "_ci_save.DRILL['before_write'] = 2.0",
            timeout=60,
        )
        call = rs.submit(rpc.handle, rpc.SaveCheckpoint(root=root))
        time.sleep(0.5)  # the ranks passed the free-space check and wait before writing: fill the disk
        with open(os.path.join(root, "filler"), "wb") as fh:
            with contextlib.suppress(OSError):
                while True:
                    fh.write(b"\0" * 65536)
                    fh.flush()
        with pytest.raises(ck.SaveFailed) as err:
            ck._storage_errors_once(call)
        msg = str(err.value)
        assert "checkpoint 'step-00000002' was not saved: rank " in msg
        assert "No space left on device (ENOSPC)" in msg and root in msg and "`latest` is still step-00000001" in msg
        assert sorted(os.listdir(root)) == ["filler", "step-00000001"]  # no partial folder
        os.remove(os.path.join(root, "filler"))
        rs.execute("_ci_save.DRILL['before_write'] = 0.0", timeout=30)

        subprocess.run(["mount", "-o", "remount,ro", root], check=True)
        with pytest.raises(ck.SaveFailed) as err:
            ck.save(root=root, rankset=rs)
        msg = str(err.value)
        assert "rank 0 cannot create" in msg and "Read-only file system (EROFS)" in msg
        assert "`latest` is still step-00000001" in msg
        assert os.listdir(root) == ["step-00000001"] and catalog.resolve(root)[1].step == 1


def test_autosaving_run_trains_through_a_failed_save_and_shows_it(ranks2, tmp_path):
    from workbench.notebook.dashboard import Dashboard, autosave_failure

    rs = ranks2
    store = stream.attach(rs).store
    try:
        with tmpfs(tmp_path / "auto", "4m") as root:
            training.setup("ddp", rankset=rs)
            ck.autosave(2, keep=2, async_=True, root=root, rankset=rs)
            run = training.start(2, rankset=rs)
            training.wait(rankset=rs, timeout=120)
            rs.apply(rpc.handle, rpc.WaitForSave())
            assert [m.step for _, m in catalog.entries(root)] == [2]
            subprocess.run(["mount", "-o", "remount,ro", root], check=True)
            run = training.start(4, rankset=rs)  # saves at 4 and 6 fail: training goes on
            assert training.wait(rankset=rs, timeout=120) == {0: "finished", 1: "finished"}
            assert [s["step"] for s in training.status(rankset=rs)] == [6, 6]
            assert store.wait(lambda s: autosave_failure(s, run) is not None, 10)
            text = autosave_failure(store, run)
            assert text.startswith("auto-save failed at step 6 (training goes on): checkpoint 'step-00000006'")
            assert "Read-only file system" in text and "`latest` is still step-00000002" in text
            line = Dashboard(rs, run=run, live=False).status_line(run)
            assert "auto-save failed at step 6" in line and "finished" in line
            assert os.listdir(root) == ["step-00000002"]
            subprocess.run(["mount", "-o", "remount,rw", root], check=True)
    finally:
        rs.apply(clean_trainer, timeout=60)
        session.of(rs).checkpoints.autosave = None


def test_retention_counts_only_good_checkpoints(tmp_path):
    """``--keep`` keeps the newest *good* auto-saves: damaged ones do not count."""
    import torch

    from workbench.engine.checkpoint import save as ck_save
    from workbench.engine.checkpoint.state import Target, TrainState

    root = str(tmp_path)
    model = torch.nn.Linear(4, 2)
    t = Target(model=model, optimizer=torch.optim.SGD(model.parameters(), lr=0.1), state=TrainState())
    for s in (2, 4):
        t.state.step = s
        ck_save.save(t, root, auto=True, keep=2)
    with open(os.path.join(root, "step-00000004", "__0_0.distcp"), "r+b") as fh:
        fh.write(b"XX")  # step 4 is now damaged
    t.state.step = 6
    ck_save.save(t, root, auto=True, keep=2)
    # keep=2 good ones: 6 and 2 (the damaged 4 between them stays, listed as damaged)
    assert [os.path.basename(f) for f, _ in catalog.entries(root)] == [
        "step-00000002",
        "step-00000004",
        "step-00000006",
    ]
    t.state.step = 8
    ck_save.save(t, root, auto=True, keep=2)
    assert [os.path.basename(f) for f, _ in catalog.entries(root)] == ["step-00000006", "step-00000008"]
    hint = ck.rollback_hint(9, float("nan"), root=root)
    assert "`%distrain ckpt load latest` rolls back to step-00000008" in hint
    os.truncate(os.path.join(root, "step-00000008", "rank-00000.json"), 1)
    hint = ck.rollback_hint(9, float("nan"), root=root)
    assert "`%distrain ckpt load step-00000006` rolls back to step-00000006" in hint
    assert "skipped step-00000008: damaged (rank-00000.json (read by rank 0) is truncated" in hint
    os.remove(os.path.join(root, "step-00000008", "manifest.json"))
    with pytest.raises(
        DamagedCheckpoint,
        match=r"step-00000008 is damaged.*manifest\.json.*is missing or "
        r"invalid.*newest good checkpoint is step-00000006",
    ):
        catalog.resolve(root, "latest")
    assert catalog.delete(root, ["step-00000008"]) == ["step-00000008"]  # a damaged one goes by its name
    assert catalog.resolve(root, "latest")[1].step == 6


def _private_folder(path: str) -> str:
    """Rank side: give this rank's main thread a mount namespace of its own with a tmpfs over
    ``path``, so that it no longer sees what the other ranks write there (a folder that is
    not shared, as a node-local disk would be)."""
    import ctypes
    import subprocess

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(0x00020000) != 0:  # CLONE_NEWNS
        raise OSError(ctypes.get_errno(), "unshare(CLONE_NEWNS) failed")
    subprocess.run(["mount", "--make-rprivate", "/"], check=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", path], check=True)
    return os.path.realpath(path)


def test_unshared_folder_refused_then_a_rank_killed_mid_load(fresh_ranks, tmp_path):
    """One private set for both drills: rank 1 gets a folder of its own, then is killed."""
    root = str(tmp_path / "ck")
    os.makedirs(root)
    rs = fresh_ranks(2)
    rs.execute(BUILD + "_ci_train(2)", timeout=120)
    ck.save(root=root, rankset=rs)
    rs.execute("_ci_train(1)", timeout=60)

    lone = str(tmp_path / "lone")  # rank 1 alone sees a different (empty) filesystem here
    os.makedirs(lone)
    rs.apply(_private_folder, lone, ranks=[1])
    with pytest.raises(ck.SaveFailed) as err:
        ck.save(root=lone, rankset=rs)
    msg = str(err.value)
    assert f"rank 1 does not see the folder rank 0 just made ({lone}/step-00000003.tmp-" in msg
    assert "is not shared by all ranks" in msg and os.listdir(lone) == []

    rs.execute(
        "from workbench.engine.checkpoint import load as _ci_load; _ci_load.DRILL['before_apply'] = 3.0", timeout=60
    )
    before = fingerprint(rs)
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(1) as pool:
        loading = pool.submit(ck.load, "step-00000002", root=root, rankset=rs)
        time.sleep(1.5)  # both ranks have read their part into staging and wait before applying
        rs.signal_rank(1, signal.SIGKILL)
        with pytest.raises(RankDied) as err:
            loading.result(timeout=60)
    msg = str(err.value)
    assert "rank 1" in msg and "killed by SIGKILL" in msg and "a restart is needed" in msg
    rs.execute("_ci_out = _ci_fp()", ranks=[0], timeout=30)
    assert rs.pull("_ci_out", ranks=[0]) == before[:1]  # rank 0 applied nothing


def _gather_with_a_long_cause():
    import torch.distributed as dist

    from workbench.engine.checkpoint import save

    rank = dist.get_rank()
    mine = {"rank": rank, "err": "é" * 5000 if rank == 1 else None, "free": 7, "plain": 1, "names": 2, "shards": 3}
    return save._gather_reports(mine, save.ckpt_group())


def test_preflight_reports_reach_every_rank_a_long_cause_cut_to_its_start(rs):
    """The preflight's one fixed-size all-gather: short reports arrive whole, a cause longer
    than the buffer (non-ASCII: 6 bytes each as JSON) arrives cut, its start kept."""
    got = rs.apply(_gather_with_a_long_cause)
    assert got[0] == got[1] and len(got[0]) == 2
    assert got[0][0] == {"rank": 0, "err": None, "free": 7, "plain": 1, "names": 2, "shards": 3}
    cut = got[0][1]
    assert cut["rank"] == 1 and cut["free"] == 7 and cut["shards"] == 3
    assert cut["err"].endswith(" ...") and set(cut["err"][:-4]) == {"é"} and 100 < len(cut["err"]) < 5000
