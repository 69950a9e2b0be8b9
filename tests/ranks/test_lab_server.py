"""The server extension's REST and websocket handlers, in a real Jupyter server under a non-root base URL."""

from __future__ import annotations

import json
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

from workbench.notebook import registry, training

BASE = "/wb/lab-base/"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, port: int, token: str):
        self.port, self.token = port, token
        self.root = f"http://127.0.0.1:{port}{BASE}"

    def request(self, method: str, path: str, body=None, token: bool = True):
        headers = {"Authorization": f"token {self.token}"} if token else {}
        data = json.dumps(body).encode() if body is not None else (b"" if method == "POST" else None)
        req = urllib.request.Request(self.root + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(req, timeout=30) as resp:
                raw = resp.read()
                return resp.status, (json.loads(raw) if raw else None)
        except urllib.error.HTTPError as exc:
            raw = exc.read()
            try:
                return exc.code, json.loads(raw)
            except ValueError:
                return exc.code, raw.decode(errors="replace")

    def ws(self, path: str, token: bool = True):
        """The first message of the websocket at ``path`` (on a thread of its own: Playwright,
        when the browser tests ran first, holds an event loop on this one)."""
        import asyncio
        import concurrent.futures

        from tornado import httpclient, websocket

        url = f"ws://127.0.0.1:{self.port}{BASE}{path}" + (f"?token={self.token}" if token else "")

        async def first_message():
            conn = await websocket.websocket_connect(httpclient.HTTPRequest(url, request_timeout=20))
            try:
                return json.loads(await conn.read_message())
            finally:
                conn.close()

        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            return pool.submit(asyncio.run, asyncio.wait_for(first_message(), 30)).result(40)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    port, token = _free_port(), secrets.token_hex(16)
    root = tmp_path_factory.mktemp("server-root")
    log = open(root / "server.log", "w")
    cmd = [
        sys.executable,
        "-m",
        "jupyter_server",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.port_retries=0",
        f"--ServerApp.base_url={BASE}",
        f"--IdentityProvider.token={token}",
        f"--ServerApp.root_dir={root}",
        '--ServerApp.jpserver_extensions={"workbench.labserver": True}',
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    srv = Server(port, token)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (root / "server.log").read_text()
            try:
                if srv.request("GET", "api/status")[0] == 200:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (root / "server.log").read_text()
            time.sleep(0.3)
        yield srv
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
        log.close()


@pytest.fixture
def announced(ranks2):
    from workbench.notebook import session, stream

    had_stream = session.of(ranks2).stream.collector is not None
    entry_id = registry.announce(ranks2)
    yield entry_id
    registry.withdraw(ranks2)
    if not had_stream:  # leave the shared set's stream as other tests expect to find it
        stream.detach(ranks2)


def _set(server, entry_id):
    status, body = server.request("GET", "workbench/ranksets")
    assert status == 200, body
    return next(s for s in body["ranksets"] if s["id"] == entry_id)


def test_lists_ranks_with_the_pids_status_reports(server, announced, ranks2):
    rs = _set(server, announced)
    assert rs["world_size"] == 2 and rs["state"] == "running" and rs["kernel_pid"] == os.getpid()
    assert [r["pid"] for r in rs["ranks"]] == [row["pid"] for row in ranks2.status()]
    assert [r["state"] for r in rs["ranks"]] == ["idle", "idle"]
    assert all(r["memory_mb"] > 10 for r in rs["ranks"])
    # busy while a cell runs on the ranks (the controller is asked, not the kernel)
    call = ranks2.execute_async("import time; time.sleep(3)")
    try:
        time.sleep(0.5)
        assert [r["state"] for r in _set(server, announced)["ranks"]] == ["busy", "busy"]
    finally:
        call.result(timeout=30)


def test_where_returns_every_ranks_stack(server, announced, ranks2):
    call = ranks2.execute_async("import time\ndef wb_lab_sleeper():\n    time.sleep(4)\nwb_lab_sleeper()")
    try:
        time.sleep(0.5)
        status, body = server.request("POST", f"workbench/ranksets/{announced}/where")
        assert status == 200, body
        assert sorted(body["stacks"]) == ["0", "1"]
        assert all("wb_lab_sleeper" in "\n".join(s["frames"]) for s in body["stacks"].values()), body
    finally:
        call.result(timeout=30)


def test_where_leads_with_the_rank_the_others_wait_for(server, announced, ranks2, tmp_path):
    """The sidebar's Where: the conclusion from the ranks' flight records, read by the server."""
    flag = tmp_path / "go"
    call = ranks2.execute_async(
        "import os, time, torch, torch.distributed as dist\n"
        "def wb_lab_loader():\n"
        f"    while not os.path.exists({str(flag)!r}):\n"
        "        time.sleep(0.02)\n"
        "if dist.get_rank() == 1:\n    wb_lab_loader()\n"
        "dist.all_reduce(torch.ones(2))\n"
    )
    try:
        deadline = time.monotonic() + 10
        while True:  # until rank 0 is inside the all_reduce
            time.sleep(0.3)
            status, body = server.request("POST", f"workbench/ranksets/{announced}/where")
            assert status == 200, body
            if body["culprit"] or time.monotonic() > deadline:
                break
        assert re.fullmatch(
            r"rank 0 waits in all_reduce #\d+ \(group world\) for \d+\.\d s; "
            r"rank 1 never entered it: it is in wb_lab_loader \(line 4 of a cell\)",
            body["culprit"],
        ), body
    finally:
        flag.touch()
        call.result(timeout=30)


def test_interrupt_from_the_server_stops_a_running_cell(server, announced, ranks2):
    from workbench.notebook.cluster import RankFailure

    call = ranks2.execute_async("import time\nwhile True:\n    time.sleep(0.05)")
    time.sleep(0.5)
    status, body = server.request("POST", f"workbench/ranksets/{announced}/interrupt")
    assert status == 200 and body["interrupted"] == [0, 1], body
    with pytest.raises(RankFailure, match="KeyboardInterrupt"):
        call.result(timeout=10)


def test_bad_requests_are_refused_with_what_works(server, announced):
    status, body = server.request("POST", f"workbench/ranksets/{announced}/explode")
    assert status == 400 and "interrupt" in body["message"], body
    status, body = server.request("POST", f"workbench/ranksets/{announced}/interrupt", body={"ranks": [5]})
    assert status == 400 and "not in this rank set" in body["message"], body
    status, body = server.request("POST", "workbench/ranksets/no-such-set/interrupt")
    assert status == 404, body
    status, body = server.request("DELETE", f"workbench/ranksets/{announced}")
    assert status == 409 and "stop it first" in body["message"], body


def test_requests_without_the_token_are_refused(server, announced):
    from tornado import httpclient

    assert server.request("GET", "workbench/ranksets", token=False)[0] == 403
    assert server.request("POST", f"workbench/ranksets/{announced}/interrupt", token=False)[0] == 403
    with pytest.raises(httpclient.HTTPClientError) as err:
        server.ws(f"workbench/ranksets/{announced}/events", token=False)
    assert err.value.code == 403


def test_websocket_sends_the_history_so_far(server, announced, ranks2):
    # rank 1's trainer lags rank 0 by 3 steps: marked a straggler
    code = (
        "from workbench.shared import events\nfrom workbench.engine import publisher, runtime\n"
        "import time\nr = runtime.context().rank\n"
        "time.sleep(1.5 if r == 0 else 0)\n"  # rank 1's last step is older as well as behind
        "for s in range(1, 6 - 3 * r):\n"
        "    publisher.emit(events.step_event(run='lab-test', rank=r, step=s, metrics={'loss': 1.0 / s}))\n"
        "publisher.flush()"
    )
    ranks2.execute(code, timeout=30)
    deadline = time.monotonic() + 10
    while True:  # the server's reader gets the mirror's history, then live batches
        msg = server.ws(f"workbench/ranksets/{announced}/events")
        steps = [(e["rank"], e["step"]) for e in msg["events"] if e.get("run") == "lab-test"]
        if len(steps) == 7 or time.monotonic() > deadline:
            break
        time.sleep(0.3)
    assert msg["type"] == "history"
    assert sorted(steps) == [(0, s) for s in range(1, 6)] + [(1, 1), (1, 2)]
    rs = _set(server, announced)
    assert rs["step"] == 5 and [r["trainer"]["step"] for r in rs["ranks"]] == [5, 2]
    assert [r["straggler"] for r in rs["ranks"]] == [False, True]
    assert rs["loss"] == pytest.approx((1 / 5 + 1 / 2) / 2)


def test_trainer_request_behind_a_running_cell_is_refused(server, announced, ranks2):
    # the request would wait behind the cell, so it is withdrawn and refused with what to do;
    # pause/resume/stop of a training run are driven from the sidebar in tests/browser
    call = ranks2.execute_async("import time; time.sleep(6)")  # longer than the server's 5 s wait
    try:
        time.sleep(0.3)
        status, body = server.request("POST", f"workbench/ranksets/{announced}/trainer-pause")
        assert status == 400 and "running a cell" in body["message"], body
    finally:
        call.result(timeout=30)
    # withdrawn, not queued: after the cell the ranks have no trainer request pending
    assert training.status(rankset=ranks2) == [{"state": "none", "step": 0}] * 2


def test_stale_entry_is_shown_as_such_then_cleaned(server):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()  # a kernel pid that is gone
    registry.write(
        {
            "version": registry.VERSION,
            "id": "test-stale-kernel",
            "host": None,
            "started": 1.0,
            "kernel_pid": child.pid,
            "kernel_started": 1.0,
            "notebook": "gone.ipynb",
            "world_size": 1,
            "ranks": [{"rank": 0, "host": socket.gethostname(), "pid": child.pid, "device": "cpu"}],
        }
    )
    try:
        rs = _set(server, "test-stale-kernel")
        assert rs["state"] == "stale" and rs["stale"] is True
        assert registry.read("test-stale-kernel") is None  # cleaned from disk at once
        assert _set(server, "test-stale-kernel")["state"] == "stale"  # still shown for a while
        status, _ = server.request("DELETE", "workbench/ranksets/test-stale-kernel")
        assert status == 204
        ids = [s["id"] for s in server.request("GET", "workbench/ranksets")[1]["ranksets"]]
        assert "test-stale-kernel" not in ids
    finally:
        registry.remove("test-stale-kernel")


def test_queued_set_is_listed_with_its_job_and_refuses_actions(server):
    # the entry the kernel writes while its Slurm job pends (a real pending job: tests/cluster)
    from workbench.notebook.cluster import RankSet, RankSetConfig
    from workbench.notebook.cluster.slurm import JobState

    rs = RankSet(RankSetConfig(n=2, launcher="slurm", backend="gloo"))
    rs.job_id = "4242"
    entry_id = registry.queued(rs, JobState("4242", "PENDING", "Resources", ()))
    try:
        got = _set(server, entry_id)
        assert got["state"] == "queued" and got["job_id"] == "4242"
        assert got["queue"] == {"job_id": "4242", "state": "PENDING", "reason": "Resources", "nodes": []}
        assert [r["state"] for r in got["ranks"]] == ["queued", "queued"]
        status, body = server.request("POST", f"workbench/ranksets/{entry_id}/interrupt")
        assert status == 409 and "Slurm job 4242 is PENDING (Resources)" in body["message"], body
        assert "%distrain stop" in body["message"]
    finally:
        registry.withdraw(rs)
