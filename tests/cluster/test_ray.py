"""Ranks placed by a real two-node Ray cluster: a head on this host (bound to its address
toward the second host) and a worker node inside the second host's network namespace,
both started here and ended here by pid (``ray_nodes.RayNodes``)."""

from __future__ import annotations

import os
import pathlib
import signal
import threading
import time

import psutil
import pytest
from checkpoint_cells import CLEAN, build_cell
from conftest import alive as _alive

from workbench.notebook.cluster import RankDied, RankSet
from workbench.notebook.cluster.ray_launcher import RayError, RayRequest
from workbench.shared.errors import Interrupted

from .daemons import free_port, processes_of
from .ray_nodes import RayNodes

pytest.importorskip("ray", reason="Ray is the optional extra .[ray] (make test installs it)")

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROFILE = ROOT / ".state" / "test" / "ray-profile"


@pytest.fixture(scope="module")
def ray_nodes(second_host):
    nodes = RayNodes(second_host, cpus=2)
    yield nodes
    nodes.close()
    assert nodes.pids() == []  # no daemon or worker of either node is left


@pytest.fixture(scope="module")
def ray_ranks(ray_nodes):
    lines: list[str] = []
    rs = RankSet.start(
        n=4,
        backend="gloo",
        threads=1,
        launcher="ray",
        ray=RayRequest(address=ray_nodes.address, cpus_per_rank=1),
        profile_dir=str(PROFILE),
        sys_path=(str(ROOT / "tests"),),
        progress=lines.append,
    )
    yield rs
    rs.stop()


def test_two_ranks_on_each_node_all_reduce_and_status_names_the_ray_node(second_host, ray_nodes, ray_ranks):
    import ray

    rs = ray_ranks
    here = os.uname().nodename
    hosts = [d["host"] for d in rs.info]
    assert sorted(hosts) == sorted([here, here, second_host.hostname, second_host.hostname])
    assert hosts[0] == hosts[1] and hosts[2] == hosts[3]  # rank = bundle: PACK fills one node, then the next
    assert rs.listen_ip == second_host.addr_here  # toward the worker node: not loopback, not 0.0.0.0
    controller = psutil.Process(rs._controller_pids()[0])
    listening = {c.laddr.ip for c in controller.net_connections("tcp") if c.status == psutil.CONN_LISTEN}
    assert listening == {second_host.addr_here}

    def reduce():
        import os

        import torch
        import torch.distributed as dist

        t = torch.ones(1) * (dist.get_rank() + 1)
        dist.all_reduce(t)
        return os.environ["MASTER_ADDR"], t.item()

    addr = {here: second_host.addr_here, second_host.hostname: second_host.addr}  # each host's veth end
    got = rs.apply(reduce, timeout=120)
    assert got == [(addr[hosts[0]], 10.0)] * 4  # MASTER_ADDR: rank 0's address, reached from both hosts

    nodes = {n["NodeManagerAddress"]: n["NodeID"][:12] for n in ray.nodes() if n["Alive"]}
    rows = rs.status()
    assert [r["ray_node"] for r in rows] == [nodes[addr[h]] for h in hosts]
    assert [r["pid"] for r in rows] == [p.pid for p in rs.procs]
    assert {r["state"] for r in rows} == {"idle"}
    assert rs.allocation().startswith(f"Ray cluster {ray_nodes.address}, placement group ")
    # each rank process is the child of a guard whose parent is the rank's Ray actor
    for r, place in enumerate(rs.launcher.places):
        guard = psutil.Process(rs.procs[r].pid).parent()
        assert guard.pid == place["guard_pid"] and guard.parent().pid == place["actor_pid"]


def test_checkpoint_saved_by_ranks_on_both_nodes_loads_onto_two_local_ranks(ray_ranks, ranks2, tmp_path):
    from workbench.notebook import checkpoints as ckpt

    rs = ray_ranks
    try:
        rs.execute(build_cell("fsdp2"), timeout=180)  # each rank holds a quarter: two on each node
        rs.execute("_ck_train(2)", timeout=180)
        info = ckpt.save(root=str(tmp_path), rankset=rs)
        assert (info["name"], info["step"]) == ("step-00000002", 2)
        rs.execute("_ck_saved = _ck_digest()", timeout=120)
        saved = rs.pull("_ck_saved")[0]
        ranks2.execute(build_cell("ddp"), timeout=180)
        loaded = ckpt.load("latest", root=str(tmp_path), rankset=ranks2)
        assert (loaded["from_strategy"], loaded["from_world_size"], loaded["world_size"]) == ("fsdp2", 4, 2)
        ranks2.execute("_ck_got = _ck_digest()", timeout=120)
        assert ranks2.pull("_ck_got") == [saved, saved]  # every parameter, bit for bit
    finally:
        rs.execute(CLEAN, timeout=60)
        ranks2.execute(CLEAN, timeout=60)


def test_a_killed_ray_actor_is_named_with_rays_death_cause(second_host, ray_ranks):
    rs = ray_ranks
    rank = max(r for r, p in enumerate(rs.launcher.places) if p["host"] == second_host.hostname)
    place = rs.launcher.places[rank]
    os.kill(place["actor_pid"], signal.SIGKILL)  # the namespace shares this pid space: the actor on "hostb"
    deadline = time.monotonic() + 30
    dead = []
    while time.monotonic() < deadline:
        dead = [d for d in rs.dead() if d["rank"] == rank]
        if dead and "Ray" in dead[0]["exit"]:
            break
        time.sleep(0.05)
    assert dead and dead[0]["host"] == second_host.hostname, rs.dead()
    assert "The actor is dead because its worker process has died" in dead[0]["exit"]
    # its rank process went with it (the guard ends with its actor)
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline and _alive([rs.procs[rank].pid, place["guard_pid"]]):
        time.sleep(0.1)
    assert _alive([rs.procs[rank].pid, place["guard_pid"]]) == []
    with pytest.raises(RankDied, match=rf"rank {rank} \(host {second_host.hostname}, pid {rs.procs[rank].pid}\)"):
        rs.apply(lambda: 1, timeout=30)


def test_stop_ends_the_actors_and_the_placement_group_and_leaves_nothing(second_host, ray_nodes, ray_ranks):
    import ray
    from ray.util.placement_group import placement_group_table

    rs = ray_ranks
    pg = rs.launcher.pg
    pids = [p.pid for p in rs.procs] + [q for place in rs.launcher.places for q in place.values() if isinstance(q, int)]
    assert rs.stop() == []
    assert _alive(pids) == []
    assert processes_of([PROFILE]) == {}  # no guard or engine on either node (they carry IPP_PROFILE_DIR)
    ray.init(address=ray_nodes.address, log_to_driver=False, configure_logging=False)
    try:
        assert placement_group_table(pg)["state"] == "REMOVED"
        # every reserved CPU given back: the raylets report freed bundles to the GCS a moment
        # after the removal, so its resource view catches up within a few seconds
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and ray.available_resources().get("CPU") != 4.0:
            time.sleep(0.2)
        assert ray.available_resources().get("CPU") == 4.0
    finally:
        ray.shutdown()


NOTEBOOK = """
import json, sys
from workbench.notebook.cluster import RankSet
from workbench.notebook.cluster.ray_launcher import RayRequest
rs = RankSet.start(n=2, backend="gloo", threads=1, launcher="ray", profile_dir=sys.argv[1],
                   ray=RayRequest(address=sys.argv[2], strategy="SPREAD"), progress=lambda line: None)
places = rs.launcher.places
print(json.dumps({"hosts": sorted(p["host"] for p in places), "pids": [p.pid for p in rs.procs]
                  + [p["actor_pid"] for p in places] + [p["guard_pid"] for p in places]}), flush=True)
import time
time.sleep(600)
"""


def test_notebook_killed_leaves_no_rank_actor_or_reservation_on_either_node(second_host, ray_nodes):
    import json
    import subprocess
    import sys

    import ray

    nb = subprocess.Popen(
        [sys.executable, "-c", NOTEBOOK, str(PROFILE), ray_nodes.address],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        started = json.loads(nb.stdout.readline())
    except ValueError:
        nb.kill()
        raise
    assert started["hosts"] == sorted([os.uname().nodename, second_host.hostname])  # SPREAD: one on each
    nb.kill()  # SIGKILL: no clean-up runs in the notebook process
    nb.wait(10)
    deadline = time.monotonic() + 30
    # the engines' nannies too: each tells the (gone) controller its engine ended, ~3 s of linger
    while time.monotonic() < deadline and (_alive(started["pids"]) or processes_of([PROFILE])):
        time.sleep(0.2)
    assert _alive(started["pids"]) == []
    assert processes_of([PROFILE]) == {}
    ray.init(address=ray_nodes.address, log_to_driver=False, configure_logging=False)
    try:
        deadline = time.monotonic() + 30  # Ray gives a dead driver's reservation back
        while time.monotonic() < deadline and ray.available_resources().get("CPU") != 4.0:
            time.sleep(0.2)
        assert ray.available_resources().get("CPU") == 4.0
    finally:
        ray.shutdown()


def test_a_waiting_placement_group_shows_as_queued_with_rays_reason_and_is_cancelled(ray_nodes):
    import ray
    from ray.util.placement_group import placement_group_table

    lines: list[str] = []
    queued: list = []
    made: list = []

    def created(rs):
        made.append(rs)
        rs.on_queue = queued.append

    def cancel_when_queued():
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not queued:
            time.sleep(0.05)
        made[0].cancel()

    threading.Thread(target=cancel_when_queued, daemon=True).start()
    with pytest.raises(Interrupted, match=r"start cancelled: Ray placement group \w+ removed while queued"):
        RankSet.start(
            n=2,
            backend="gloo",
            launcher="ray",
            ray=RayRequest(address=ray_nodes.address, cpus_per_rank=3),  # no node has 3 CPUs
            profile_dir=str(PROFILE),
            progress=lines.append,
            on_created=created,
        )
    assert queued[0].state == "PENDING" and queued[0].reason.startswith("INFEASIBLE: 2 x {CPU=3}")
    assert lines[0] == f"queued: Ray placement group {queued[0].job_id} PENDING ({queued[0].reason})"
    rs = made[0]
    assert rs.cluster is None  # no controller was started for a group that never got its resources
    ray.init(address=ray_nodes.address, log_to_driver=False, configure_logging=False)
    try:
        assert placement_group_table(rs.launcher.pg)["state"] == "REMOVED"
    finally:
        ray.shutdown()


def test_the_failure_budget_brings_a_ray_run_back_in_a_new_placement_group(ray_nodes, fresh_ranks, tmp_path):
    """`train start --max-failures` on Ray ranks: a rank SIGKILLed at step 15, nobody typing; the
    set is restarted in a new placement group (the old one removed) and trains on to step 40."""
    import ray
    from ray.util.placement_group import placement_group_table
    from test_recovery import KILL_HOOK

    from workbench.notebook import api, metrics, training
    from workbench.notebook import checkpoints as ck

    rs = fresh_ranks(
        2, launcher="ray", ray=RayRequest(address=ray_nodes.address, cpus_per_rank=1), profile_dir=str(PROFILE)
    )
    pg = rs.launcher.pg
    training.setup("ddp", rankset=rs)
    ck.autosave(10, keep=2, async_=False, root=str(tmp_path), rankset=rs)
    api.run(KILL_HOOK.format(at=15, flush=""), ranks=[1], display=False)
    training.start(40, max_failures=1, rankset=rs)
    assert training.wait(timeout=600) == {0: "finished", 1: "finished"}  # only waiting
    sess = api.session()
    new = sess.rankset
    assert new is not rs and new.config.launcher == "ray" and new.launcher.pg != pg
    (rec,) = sess.recoveries
    assert (rec["kind"], rec["rank"], rec["checkpoint_step"]) == ("died", 1, 10), rec
    loss = metrics.metrics()
    loss = loss[loss["metric"] == "loss"]
    for rank in (0, 1):  # every step once, the redone ones replaced
        assert loss[loss["rank"] == rank]["step"].tolist() == list(range(1, 41))
    assert ray.is_initialized()  # the new set's launcher is this process's Ray connection
    assert placement_group_table(pg)["state"] == "REMOVED"
    assert placement_group_table(new.launcher.pg)["state"] == "CREATED"


def test_no_ray_cluster_at_the_address_says_how_to_start_one():
    with pytest.raises(RayError, match=r"no Ray cluster at 127\.0\.0\.1:\d+ .*ray start --head"):
        RankSet.start(n=2, launcher="ray", ray=RayRequest(address=f"127.0.0.1:{free_port()}"))
