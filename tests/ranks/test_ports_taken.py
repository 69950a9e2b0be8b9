"""A controller whose part lost its port: the start sees it at once and starts a new controller.

The controller chooses its ports, then its parts (heart monitor, schedulers, queues) bind
them in processes of their own; another process can take one in between. Here that is made
to happen for real: the first controller to read this profile's config is given ports chosen
by the test, its heart monitor's (``hb_ping``) held by a listening socket of the test. Without
the watch the ranks register but are never admitted (no heartbeat) and the start fails after
its 60 s limit.
"""

from __future__ import annotations

import re
import socket
import time

import psutil
from conftest import alive

HB_PING = 5  # ipyparallel takes the engine ports in order: registration, control, mux, task, iopub, hb_ping, ...

CONFIG = """\
import os
if os.path.exists({marker!r}):  # the first controller only
    os.remove({marker!r})
    c.IPController.engine_ports = {ports!r}
"""


def _free_ports(n: int) -> list[int]:
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


def _this_set(rs) -> set[int]:
    """The processes of the set that started (its controller's parts included)."""
    from workbench.notebook.cluster import health

    return set(rs.started_pids) | set(health.process_tree(rs.started_pids))


def test_a_part_that_lost_its_port_ends_the_controller_and_the_start_uses_a_new_one(fresh_ranks, tmp_path):
    profile = tmp_path / "profile"
    profile.mkdir()
    marker = tmp_path / "first-controller"
    marker.touch()
    ports = _free_ports(9)
    (profile / "ipcontroller_config.py").write_text(CONFIG.format(marker=str(marker), ports=ports))
    lines: list[str] = []
    with socket.socket() as thief:
        thief.bind(("127.0.0.1", ports[HB_PING]))
        thief.listen()
        before = {p.pid for p in psutil.Process().children(recursive=True)}
        rs = fresh_ranks(2, profile_dir=str(profile), progress=lines.append)
    assert not marker.exists()  # the first controller read the ports
    said = "\n".join(lines)
    m = re.search(
        r"the controller \(pid (\d+)\) ended before the ranks registered: its part start_heartmonitor: "
        r"ZMQError: Address already in use \(addr='tcp://127\.0\.0\.1:(\d+)'\); starting a new controller",
        said,
    )
    assert m, said
    assert int(m.group(2)) == ports[HB_PING]
    assert alive([int(m.group(1))]) == []
    # the set works, on the second controller, and nothing of the first attempt is left
    assert rs.apply(lambda: __import__("workbench").engine.rank) == [0, 1]
    now = {p.pid for p in psutil.Process().children(recursive=True)}
    deadline = time.monotonic() + 10
    while (left := alive(now - before - _this_set(rs))) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert left == [], [psutil.Process(p).cmdline() for p in left]
