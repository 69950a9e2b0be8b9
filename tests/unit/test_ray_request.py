"""What ``--launcher ray`` asks of Ray, and the words it uses for a dead actor (no Ray needed)."""

from __future__ import annotations

import pytest

from workbench.notebook.cluster.rankset import RankSetConfig
from workbench.notebook.cluster.ray_launcher import RayRequest, death_cause


def test_each_rank_reserves_its_cpus_and_gpus_as_one_bundle():
    assert RayRequest().bundle() == {"CPU": 1.0}
    assert RayRequest(cpus_per_rank=4, gpus_per_rank=1).bundle() == {"CPU": 4.0, "GPU": 1.0}
    assert RayRequest(cpus_per_rank=0.5).bundle() == {"CPU": 0.5}


def test_the_address_is_the_flag_else_ray_address_else_auto(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    assert RayRequest().resolved_address() == "auto"
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.5:6379")
    assert RayRequest().resolved_address() == "10.0.0.5:6379"
    assert RayRequest(address="head:6379").resolved_address() == "head:6379"


@pytest.mark.parametrize(
    "request_, message",
    [
        (RayRequest(cpus_per_rank=-1), "--cpus-per-rank must be a number >= 0, got -1"),
        (RayRequest(gpus_per_rank="x"), "--gpus-per-rank must be a number >= 0, got 'x'"),
        (RayRequest(strategy="ANYWHERE"), "placement strategy 'ANYWHERE' is not known: use one of PACK, SPREAD"),
    ],
)
def test_bad_requests_are_refused_before_anything_starts(request_, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        RankSetConfig(n=2, launcher="ray", ray=request_).validate()


def test_ray_settings_go_with_the_ray_launcher_only():
    with pytest.raises(ValueError, match="--address/--cpus-per-rank/--gpus-per-rank go with --launcher ray"):
        RankSetConfig(n=2, launcher="local", ray=RayRequest(address="head:6379")).validate()
    RankSetConfig(n=2, launcher="ray", ip="127.0.0.1", python="/usr/bin/python3").validate()  # both accepted


def test_rays_death_cause_is_kept_without_its_troubleshooting_paragraph():
    text = (
        "The actor died unexpectedly before finishing this task.\n\tclass_name: RankHost\n\tpid: 11904\n"
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
        "detail: Worker unexpectedly exits with a connection error code 2. End of file. Some common causes "
        "include: (1) the process was killed by the OOM killer"
    )
    assert death_cause(RuntimeError(text)) == (
        "The actor is dead because its worker process has died. Worker exit type: SYSTEM_ERROR Worker exit "
        "detail: Worker unexpectedly exits with a connection error code 2. End of file."
    )
    assert death_cause(RuntimeError("")) == "RuntimeError"


def test_rays_cause_stays_with_a_death_whichever_report_comes_first():
    import os

    from workbench.notebook.cluster import health

    w = health.Watcher([health.RankProcess(0, "another-host", os.getpid())])  # not this host: not polled
    try:
        cause = "The actor is dead because its worker process has died."
        w.mark_dead(0, f"lost its Ray actor: {cause}")
        w.add_cause(0, cause, f"Ray: {cause}")
        assert w.deaths[0]["exit"] == f"lost its Ray actor: {cause}"  # said once
        w.mark_dead(0, "terminated by SIGTERM", exit_code=-15)  # the guard's exit status replaces it
        assert w.deaths[0]["exit"] == f"terminated by SIGTERM (Ray: {cause})"
    finally:
        w.close()
