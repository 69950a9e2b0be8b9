"""Pure parts of the cluster launchers: the Slurm script, --hosts, GPU pinning, signed lines.

The real daemons (Slurm, a second host over SSH) are exercised in tests/cluster/.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workbench.engine.runtime import visible_gpu
from workbench.notebook.cluster import launchers, network, ssh
from workbench.notebook.cluster.slurm import SlurmRequest, batch_template, parse_sbatch
from workbench.shared import wire


def test_every_slurm_option_is_a_line_of_the_script():
    req = SlurmRequest(
        nodes=2,
        gpus_per_node=4,
        partition="gpu",
        time="1:00:00",
        account="proj",
        sbatch=parse_sbatch('--constraint="h100|a100" --qos=high'),
    )
    req.validate()
    script = batch_template(req, 8)
    for line in (
        "#SBATCH --ntasks=8",
        "#SBATCH --nodes=2",
        "#SBATCH --ntasks-per-node=4",
        "#SBATCH --gpus-per-node=4",
        "#SBATCH --partition=gpu",
        "#SBATCH --time=1:00:00",
        "#SBATCH --account=proj",
        "#SBATCH '--constraint=h100|a100'",
        "#SBATCH --qos=high",
    ):
        assert line in script.splitlines(), line
    assert "srun" in script and "{program_and_args}" in script


def test_braces_in_options_survive_ipyparallels_formatting():
    from ipyparallel.cluster.launcher import EvalFormatter

    script = batch_template(SlurmRequest(sbatch=("--comment={x}",)), 2)
    out = EvalFormatter().format(script, program_and_args="run", cluster_id="c", output_file="o")
    assert "#SBATCH '--comment={x}'" in out and out.rstrip().endswith("run")


@pytest.mark.parametrize(
    "req, words",
    [
        (SlurmRequest(nodes=0), "--nodes must be a whole number"),
        (SlurmRequest(time="soon"), "is not a Slurm time"),
        (SlurmRequest(sbatch=("constraint=h100",)), "takes sbatch options"),
    ],
)
def test_bad_slurm_requests(req, words):
    with pytest.raises(ValueError, match=words):
        req.validate()


def test_hosts_parse_and_name_this_machine():
    slots = ssh.parse_hosts("localhost:2,root@node7:3")
    assert [(s.host, s.n, s.local) for s in slots] == [("localhost", 2, True), ("root@node7", 3, False)]
    for bad in ("a", "a:0", "a:2,a:2", "a b:2"):
        with pytest.raises(ValueError):
            ssh.parse_hosts(bad)


def test_listen_address_never_loopback_for_remote_and_checks_ip():
    assert network.listen_address(None, []) == "127.0.0.1"
    with pytest.raises(network.AddressError, match="loopback"):
        network.listen_address("127.0.0.1", ["node7"])
    with pytest.raises(network.AddressError, match="not an address of this host"):
        network.check_ip("10.255.255.1")


def test_gpu_pinned_by_local_rank_among_visible():
    assert visible_gpu(1, "4,5,6,7", 0) == "5"
    assert visible_gpu(5, "4,5", 0) == "5"
    assert visible_gpu(2, None, 4) == "2"
    assert visible_gpu(0, None, 0) is None


def test_guard_lines_are_signed():
    line = wire.sign(b"k" * 32, '{"kind": "exit", "code": -9}')
    assert wire.verify(b"k" * 32, line) == {"kind": "exit", "code": -9}
    assert wire.verify(b"x" * 32, line) is None
    assert wire.verify(b"k" * 32, line.replace(b"-9", b"-1")) is None


def test_the_guard_runs_by_path_as_ssh_and_slurm_start_it():
    """Started as ``ssh.guard_cmd`` starts it (by path, not as a module of the package): without
    its lifeline it refuses by name, where an import it cannot make would end it first."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("WORKBENCH_LIFELINE")}
    out = subprocess.run(
        [*ssh.guard_cmd(sys.executable), "--", "true"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and f"{wire.ENV_LIFELINE} and {wire.ENV_LIFELINE_KEY} must be set" in out.stderr, (
        out.stderr
    )


def test_the_broadcast_tree_deepens_past_256_ranks_with_leaves_of_at_most_128():
    depths = {n: launchers.broadcast_depth(n) for n in (2, 8, 64, 256, 257, 512, 513, 1024, 4096)}
    assert depths == {2: 1, 8: 1, 64: 1, 256: 1, 257: 2, 512: 2, 513: 3, 1024: 3, 4096: 5}
    for n, depth in depths.items():  # rank r is on leaf r % 2**depth
        assert -(-n // 2**depth) <= max(launchers.LEAF_RANKS, -(-n // 2))
    for launcher in ("local", "mpi", "slurm", "ssh"):  # every controller is started with it
        args = launchers.cluster_kwargs(launcher, 1024)["controller_args"]
        assert "--IPController.broadcast_scheduler_depth=3" in args
