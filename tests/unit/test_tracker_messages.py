"""Asking for a tracker that does not exist or is not installed: one message naming what would work."""

import sys

import pytest

from workbench.notebook import trackers
from workbench.notebook.commands import UsageError, dispatch


def test_unknown_tracker_names_the_four():
    with pytest.raises(
        UsageError, match="unknown action 'neptune' for `%distrain track`: use one of start, stop, list"
    ):
        dispatch("track neptune")
    with pytest.raises(
        UsageError, match="invalid choice: 'neptune' \\(choose from 'tensorboard', 'mlflow', 'wandb', 'trackio'\\)"
    ):
        dispatch("track start neptune")
    with pytest.raises(
        trackers.TrackerError, match="unknown tracker 'neptune': use one of tensorboard, mlflow, wandb, trackio"
    ):
        trackers.track("neptune")
    with pytest.raises(UsageError, match="invalid choice: 'neptune'"):
        dispatch("track stop neptune")


def test_missing_package_names_the_extra(monkeypatch):
    # None in sys.modules is Python's own mark of a module that cannot be imported
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(
        UsageError,
        match=r"needs the 'mlflow' package, which is not installed here: pip install 'distrain-workbench\[mlflow\]'",
    ):
        dispatch("track start mlflow --dir x")


def test_no_rank_set_says_start_one_first():
    from workbench.notebook import session

    with session.using(None), pytest.raises(UsageError, match="no rank set to track yet: start one first"):
        dispatch("track start tensorboard")


def test_the_magics_and_the_tracker_api_import_no_tracker_package():
    """Tracker packages take seconds to import: loaded only when a tracker is opened."""
    import subprocess

    code = (
        "import sys, workbench.notebook.trackers\n"
        "from workbench.notebook.commands import load_all\nload_all()\n"
        "print(sorted({'mlflow', 'wandb', 'trackio', 'tensorboard', 'torch'} & set(sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.stdout.strip().splitlines()[-1] == "[]", out.stderr


def test_step_values_per_rank_and_mean_and_metric_patterns():
    from workbench.notebook.trackers.mirror import step_values

    rows = {
        r: {
            "run": "r1",
            "rank": r,
            "step": 3,
            "time": 0.0,
            "source": "user",
            "loss": 1.0 + r,
            "tps": 10.0 * (r + 1),
            "memory_rss_bytes": 5.0,
            "grad_norm": None,
        }
        for r in (0, 1)
    }
    assert step_values("r1", rows) == {
        "r1/loss/rank0": 1.0,
        "r1/tps/rank0": 10.0,
        "r1/memory_rss_bytes/rank0": 5.0,
        "r1/loss/rank1": 2.0,
        "r1/tps/rank1": 20.0,
        "r1/memory_rss_bytes/rank1": 5.0,
        "r1/loss/mean": 1.5,
        "r1/tps/mean": 15.0,
        "r1/memory_rss_bytes/mean": 5.0,
    }
    assert sorted(step_values("r1", rows, trackers.parse_metrics("loss, memory_*"))) == [
        "r1/loss/mean",
        "r1/loss/rank0",
        "r1/loss/rank1",
        "r1/memory_rss_bytes/mean",
        "r1/memory_rss_bytes/rank0",
        "r1/memory_rss_bytes/rank1",
    ]
    with pytest.raises(trackers.TrackerError, match="names no metric"):
        trackers.parse_metrics(" , ")
