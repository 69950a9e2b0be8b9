"""``--fault-tolerant`` refusals: each a single line naming what was wrong and what works,
decided before anything starts (the run itself: tests/ranks/test_fault_tolerant.py)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from workbench.notebook.cluster import lighthouse
from workbench.notebook.cluster.rankset import RankSetConfig
from workbench.notebook.commands import UsageError, dispatch
from workbench.notebook.runs import fault_tolerant


def ranks(n=4, backend="gloo", launcher="local", forked=True):
    """What the checks read of a rank set: its config, how it was started and its ranks' backend."""
    return SimpleNamespace(
        config=RankSetConfig(n=n, backend="gloo", launcher=launcher, hosts="a:4" if launcher == "ssh" else None),
        forked=object() if forked else None,
        info=[{"backend": backend}] * n,
        world_size=n,
    )


def check(rs=None, **kwargs):
    args = {"strategy": "ddp", "replicas": 2, "quorum_timeout": 5.0, "steps": 10, **kwargs}
    return fault_tolerant.check(rs or ranks(), **args)


def test_a_replicated_layout_is_split_into_equal_replica_groups():
    assert check() == 2
    assert check(ranks(6), replicas=3) == 2
    assert check(ranks(4), replicas=4) == 1


def test_hsdp_replicas_are_the_replica_groups_and_their_ranks_shard():
    assert check(strategy="hsdp") == 2
    assert check(ranks(8), strategy="hsdp", replicas=2) == 4
    assert check(ranks(6), strategy="HSDP", replicas=3) == 2
    with pytest.raises(ValueError, match=r"leaves 1 rank per replica; use one of \(none: start at least 4 ranks\)"):
        check(ranks(2), strategy="hsdp")


@pytest.mark.parametrize(
    "kwargs, says",
    [
        ({"strategy": "fsdp2"}, "--fault-tolerant runs a replicated layout: --strategy ddp or hsdp, not 'fsdp2'"),
        ({"strategy": "tp"}, "tensor, pipeline and fully sharded layouts have no replica to lose"),
        ({"strategy": "pp"}, "tensor, pipeline and fully sharded layouts have no replica to lose"),
        (
            {"strategy": "hsdp", "replicas": 4},
            "--strategy hsdp shards each replica over its ranks: --replicas 4 leaves 1 rank per replica; use one of [2]",
        ),
        (
            {"strategy": "hsdp dp_shard=2"},
            "--fault-tolerant takes --strategy hsdp without options (got 'hsdp dp_shard=2'): --replicas R sets",
        ),
        ({"strategy": "ddp bucket_mb=25"}, "--fault-tolerant takes --strategy ddp without options"),
        (
            {"replicas": 3},
            "--replicas 3 does not split 4 ranks into equal replica groups of 2 or more replicas: use one of [2, 4]",
        ),
        ({"replicas": 1}, "--replicas 1 does not split 4 ranks"),
        ({"quorum_timeout": 0}, "--quorum-timeout must be a positive number of seconds"),
    ],
)
def test_what_cannot_run_fault_tolerant_is_refused_in_one_line(kwargs, says):
    with pytest.raises(ValueError) as err:
        check(**kwargs)
    assert says in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_without_torchft_it_is_refused_saying_how_to_install(monkeypatch):
    monkeypatch.setattr(lighthouse, "binary", lambda: None)
    with pytest.raises(ValueError, match=r"--fault-tolerant needs torchft: torchft is not installed .*\[ft\]"):
        check()


def test_ranks_it_cannot_replace_are_refused():
    with pytest.raises(ValueError, match="--fault-tolerant replaces lost ranks on this host"):
        check(ranks(launcher="ssh", forked=False))
    with pytest.raises(ValueError, match="runs on gloo ranks here \\(these use nccl\\): start with --backend gloo"):
        check(ranks(backend="nccl"))


@pytest.mark.parametrize(
    "flags", ["--max-failures 2", "--step-timeout 30", "--grad-accum 2", "--max-failures 1 --setup code"]
)
def test_flags_of_the_other_recovery_are_refused_with_it(flags):
    with pytest.raises(UsageError) as err:
        dispatch(f"train start --fault-tolerant {flags}")
    message = str(err.value)
    assert "cannot go with --fault-tolerant" in message and "nothing was started" in message and "\n" not in message


@pytest.mark.parametrize(
    "first_step, says",
    [
        (212, "healed from a live peer and rejoined at step 212, 9.0 s after the failure"),
        (1, "found no live peer and started over from step 1, 9.0 s after the failure"),
        (None, "healing from a live peer"),
    ],
)
def test_a_replacement_record_says_whether_it_healed_from_a_peer_or_started_over(first_step, says):
    rec = {
        "n": 1, "replica": 1, "rank": 3, "host": "h", "failed_step": 31, "ranks": [2, 3], "restart_s": 8.0,
        "checkpoint_step": first_step, "rejoined_s": 9.0, "reason": "SIGKILL",
    }  # fmt: skip
    text = fault_tolerant.describe(rec)
    assert text.startswith("replacement 1: replica 1 lost rank 3 (host h) at step 31") and text.endswith(says), text
