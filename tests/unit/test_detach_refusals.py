"""Tier 1: what ``%distrain detach`` / ``attach`` refuse, with nothing started or changed."""

import sys

import pytest

from workbench.notebook import handoff, session
from workbench.notebook.cluster import RankSet, RankSetConfig, adoption
from workbench.shared.errors import NotRunning


def test_sets_whose_ranks_end_with_the_kernels_connection_are_refused():
    rs = RankSet(RankSetConfig(n=2, launcher="slurm", backend="gloo"))
    why = adoption.refusal(rs)
    assert why.startswith("a set started with --launcher slurm cannot be detached") and "--launcher local" in why
    local = RankSet(RankSetConfig(n=2, backend="gloo", launcher_options={"engines": "mpi"}))
    assert "cannot be detached" in adoption.refusal(local)
    assert adoption.refusal(RankSet(RankSetConfig(n=2, backend="gloo"))) is None


def test_detach_without_ranks_and_attach_of_an_unknown_name_say_what_there_is(monkeypatch, tmp_path):
    monkeypatch.setenv("JUPYTER_RUNTIME_DIR", str(tmp_path))  # an empty registry
    with session.using(None):
        with pytest.raises(NotRunning, match="there is nothing to detach"):
            handoff.detach()
    with pytest.raises(handoff.DetachError) as err:
        handoff.attach("overnight")
    assert str(err.value) == (
        "there is no detached rank set named 'overnight'; there are no detached sets (`%distrain detach` makes one)"
    )


def test_a_setup_function_without_cloudpickle_is_refused_naming_what_to_pass(monkeypatch):
    def rebuild():
        pass

    assert handoff._packed_setup("code = 1") == "code = 1"  # code travels as it is
    monkeypatch.setitem(sys.modules, "cloudpickle", None)  # as if not installed
    with pytest.raises(handoff.DetachError) as err:
        handoff._packed_setup(rebuild)
    msg = str(err.value)
    assert msg.startswith("the recovery setup is a function (")
    assert "rebuild()" in msg and "needs the cloudpickle package" in msg
    assert "pass the setup as code instead" in msg and msg.endswith("nothing was changed")
