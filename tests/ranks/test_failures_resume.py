"""`%distrain restart --load`: restart the ranks (here with another world size) and continue
from the latest checkpoint, the trainer rebuilt by repeating the latest ``training.setup``."""

from __future__ import annotations

import pytest

from workbench.engine import control
from workbench.notebook import api, training
from workbench.notebook import checkpoints as ck
from workbench.notebook.commands import UsageError, dispatch
from workbench.shared.checkpoint import catalog


def test_restart_load_with_fewer_ranks_continues_from_latest(fresh_ranks, tmp_path, capsys):
    root = str(tmp_path)
    rs = fresh_ranks(2)
    with pytest.raises(UsageError, match="go with --load"):
        dispatch(f"restart --dir {root}")
    training.setup("ddp", rankset=rs)
    ck.autosave(2, keep=5, async_=False, root=root, rankset=rs)
    try:
        training.start(5, rankset=rs)
        assert training.wait(timeout=120, rankset=rs) == {0: "finished", 1: "finished"}
        assert [m.step for _, m in catalog.entries(root)] == [2, 4]
        dispatch(f"restart --load -n 1 --dir {root}")
        out = capsys.readouterr().out
        assert "1 ranks up again" in out and "loaded step-00000004" in out and "on 2 ranks into ddp on 1" in out
        rs2 = api.current()
        assert rs2 is not rs and rs2.world_size == 1 and not rs.running
        assert [s["step"] for s in rs2.apply(control.status)] == [4]
        run = training.start(2)  # continues at step 5; the auto-save came back with the restart
        assert training.wait(timeout=120) == {0: "finished"}
        assert training.status()[0]["step"] == 6 and run != ""
        assert [m.step for _, m in catalog.entries(root)] == [2, 4, 6]
    finally:
        api.session().checkpoints.autosave = None


def test_trainer_step_timeout_usage_error_changes_nothing():
    with pytest.raises(UsageError, match="argument --step-timeout: expected a positive number of seconds"):
        dispatch("train start --gpt tiny --step-timeout 0")
    with pytest.raises(UsageError, match="go with --load"):
        dispatch("restart --setup CODE")
