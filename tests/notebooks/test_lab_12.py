"""Execute lab 12 (training across a slow link) headless, instructor version: a network
namespace joined by a rate-limited veth pair, rank 1's sockets on the far side, DDP against
torchft's LocalSGD and DiLoCo on it; every check passes on the bytes and seconds measured in
the run, and neither rank, namespace, veth nor the link's watchdog is left. Its student
version runs to its first blank in test_labs_student (in the same kernel, see lab_runs).

The lab's machinery on its own: a socket opened inside ``on_host`` belongs to the other host
(its bytes cross the veth, at the rate ``tbf`` allows), and a kernel that made links, killed
(SIGKILL), leaves none: the watchdog removes each namespace and veth pair within seconds.
All need root (``ip netns add``), as the suite runs.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import threading
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


def test_a_socket_opened_on_the_other_host_crosses_the_shaped_link():
    from workbench.labs.lab_12 import SlowLink, on_host

    with SlowLink(mbit=8) as link:
        server = socket.create_server((link.addr_here, 0))
        with on_host(link.netns, link.veth_there):
            inside = {name for _, name in socket.if_nameindex()}
            gloo = os.environ["GLOO_SOCKET_IFNAME"]
            client = socket.create_connection(server.getsockname(), timeout=10)
        assert inside == {"lo", link.veth_there} and gloo == link.veth_there
        here = {name for _, name in socket.if_nameindex()}
        assert link.veth_here in here and link.veth_there not in here  # back on this host
        assert os.environ.get("GLOO_SOCKET_IFNAME") != link.veth_there
        conn, _ = server.accept()
        payload, got = 400_000, []
        reader = threading.Thread(target=lambda: got.append(len(conn.recv(payload, socket.MSG_WAITALL))))
        c0, t0 = link.counters()["bytes"], time.perf_counter()
        reader.start()
        client.sendall(b"x" * payload)  # the socket stays on the other host after the block
        reader.join(30)
        seconds, moved = time.perf_counter() - t0, link.counters()["bytes"] - c0
        for s in (client, conn, server):
            s.close()
        assert got == [payload] and moved >= payload
        # tbf's 32 KiB burst goes at once, the rest at 8 Mbit/s
        assert seconds >= 0.9 * (payload - 32 * 1024) * 8 / 8e6, seconds
    assert not link.exists()


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
