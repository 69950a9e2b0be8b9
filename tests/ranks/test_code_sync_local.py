"""Ranks on the notebook's host import from its folder itself: their set has no sync part, a cell
walks nothing, and the sync flags are refused with the local launcher, nothing started."""

from __future__ import annotations

import pytest

from workbench.notebook import api, session
from workbench.notebook.cluster import code_scan
from workbench.notebook.commands import UsageError, dispatch


def test_local_ranks_have_no_sync_part_and_a_cell_walks_nothing(ranks2, monkeypatch):
    assert ranks2.code_sync is None

    def walked(self):
        raise AssertionError(f"a cell on local ranks walked {self.path}")

    monkeypatch.setattr(code_scan.Folder, "scan", walked)
    with session.using(ranks2):
        api.run("x = 1", display=False, timeout=60)
    assert ranks2.pull("x") == [1, 1]


@pytest.mark.parametrize("flags", ["--sync .", "--sync-limit 1G", "--no-sync"])
def test_the_sync_flags_are_refused_with_local_ranks(flags):
    before = dict(api.sessions())
    with pytest.raises(UsageError, match="--sync, --sync-limit and --no-sync go with --launcher ssh, slurm or ray"):
        dispatch(f"start -n 2 {flags} --session refused_sync")
    assert dict(api.sessions()) == before
