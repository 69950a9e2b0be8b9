"""Asking for a tracker that does not exist or is not installed: one message naming what would work."""

import sys

import pytest

from workbench.notebook import trackers
from workbench.notebook.commands import UsageError, dispatch


def test_unknown_tracker_names_the_four():
    with pytest.raises(
        UsageError,
        match="unknown action 'neptune' for `%distrain track`: use one of tensorboard, mlflow, wandb, trackio",
    ):
        dispatch("track neptune")
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
        dispatch("track mlflow --dir x")


def test_no_rank_set_says_start_one_first():
    from workbench.notebook import session

    with session.using(None), pytest.raises(UsageError, match="no rank set to track yet: start one first"):
        dispatch("track tensorboard")


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
