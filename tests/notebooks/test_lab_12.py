"""Execute lab 12 (training across a slow link) headless, instructor version: a network
namespace joined by a rate-limited veth pair, rank 1's sockets on the far side, DDP against
torchft's LocalSGD and DiLoCo on it; every check passes on the bytes and seconds measured in
the run, and neither rank, namespace, veth nor the link's watchdog is left. Its student
version runs to its first blank in test_labs_student (in the same kernel, see lab_runs).

The second test kills (SIGKILL) a kernel that made a link: its watchdog removes the namespace
and the veth pair within seconds. Both need root (``ip netns add``), as the suite runs.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
from pathlib import Path

import nbformat
import psutil
import pytest
from lab_runs import lab_run, runnable
from notebook_runs import check_lab_run, check_lab_source, private_env
from test_labs_topics import expected_passes

ROOT = Path(__file__).resolve().parents[2]
LAB = "lab_12_slow_link.ipynb"
LAB_VERSION, LAB_PARAM = "instructor", "name"  # the runs: lab_runs.lab_run

pytestmark = pytest.mark.skipif(bool(runnable(LAB)), reason=str(runnable(LAB)))

NEEDLES = [
    "16 Mbit/s each way",
    "rank 1: on the other host, sees interfaces ['lo', 'wb12b",  # rank 1's sockets open on the other host
    "check passed: a 1 MiB all-reduce over link_group put",
    "check passed: after 40 DDP steps both ranks hold the same weights",
    "check passed: LocalSGD synced 4 times, at steps [10, 20, 30, 40]",
    "and after the last sync both replicas hold the same weights",
    "by then DDP had taken",
    "the link is gone",
]


def link_left(netns: str, veth: str) -> list[str]:
    """What of a link is still there: its namespace, its veth, its watchdog process."""
    left = (
        [netns]
        if netns in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
        else []
    )
    if os.path.exists(f"/sys/class/net/{veth}"):
        left.append(veth)
    for p in psutil.process_iter(["cmdline"]):
        if veth in (p.info["cmdline"] or []):
            left.append(f"watchdog pid {p.pid}")
    return left


@pytest.mark.parametrize("name", [LAB])
def test_lab_12_runs_ddp_and_torchft_over_the_link_and_its_checks_pass(name, request):
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    check_lab_source(nb, 2)
    text = check_lab_run(lab_run(request, name), 2, expected_passes(nb), NEEDLES)
    # the measured values the lesson rests on, as printed
    bound_ms, ddp_ms = map(
        int, re.search(r"check passed: (\d+) ms: .* the run measured (\d+) ms per DDP step", text).groups()
    )
    assert bound_ms == 149 and ddp_ms >= bound_ms * 0.9  # 297,988 bytes at 16 Mbit/s
    local, diloco = map(
        float, re.search(r"LocalSGD and DiLoCo put ([\d.]+) and ([\d.]+) of DDP's bytes", text).groups()
    )
    assert local < 0.2 and diloco < 0.2  # H = 10: about 0.1 of DDP's bytes per step
    assert re.search(r"DiLoCo sent ([\d.]+)x fewer bytes per step than DDP \(H = 10\)", text)
    netns = re.search(r"in (wblab12-\d+):", text).group(1)
    assert link_left(netns, "wb12a" + netns.removeprefix("wblab12-")) == []


def test_a_killed_kernel_leaves_no_link(tmp_path):
    from jupyter_client.manager import start_new_kernel

    km, kc = start_new_kernel(kernel_name="python3", env=private_env(tmp_path))
    outputs: list[str] = []
    code = (
        "from workbench.labs.lab_12 import SlowLink\n"
        "links = [SlowLink(mbit=8), SlowLink(mbit=8)]  # a cell run twice: two links, names and subnets apart\n"
        "print(*[f'{l.netns} {l.veth_here} {l.addr_here}' for l in links])"
    )
    try:
        reply = kc.execute_interactive(
            code, timeout=60, output_hook=lambda msg: outputs.append(msg["content"].get("text", ""))
        )
        assert reply["content"]["status"] == "ok", reply["content"]
        words = "".join(outputs).split()
        links = [words[0:2], words[3:5]]
        assert words[0] != words[3] and words[2].rsplit(".", 1)[0] != words[5].rsplit(".", 1)[0], words
        for netns, veth in links:
            assert link_left(netns, veth)[:2] == [netns, veth]
        os.kill(km.provisioner.process.pid, signal.SIGKILL)  # no close(), no atexit: the kernel is gone
        deadline = time.monotonic() + 10
        while any(link_left(*link) for link in links) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert [link_left(*link) for link in links] == [[], []]
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)
