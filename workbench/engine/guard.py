"""A rank's guard on a host the notebook does not run on: ``python -m workbench.engine.guard -- CMD``.

Slurm, SSH and Ray start this around the ipyparallel engine and it holds one signed TCP
lifeline to the notebook: as the engine's parent it reports a rank's exit at once; when the
notebook is gone it ends the engine (and the Slurm job), so a killed kernel leaves no rank
behind; its beats let the notebook name a host that fell silent. Plain standard library: it
runs before torch or the engine is imported."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from workbench.shared import wire  # absolute: the guard runs by path (ssh.guard_cmd), not as a module

END_GRACE_S = 2.0
# unacknowledged beats on a dead link: the connection is given up after this long (without it
# the kernel retransmits for ~15 minutes before keepalive or a read sees the link is gone)
GIVE_UP_MS = 10_000


def _connect(address: str) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=15)
    sock.settimeout(None)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    # a notebook host that vanishes without closing (power, network) is given up on after
    # 4 s idle + 3 probes 2 s apart, or GIVE_UP_MS of unacknowledged beats
    for opt, value in (("TCP_KEEPIDLE", 4), ("TCP_KEEPINTVL", 2), ("TCP_KEEPCNT", 3), ("TCP_USER_TIMEOUT", GIVE_UP_MS)):
        if hasattr(socket, opt):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, opt), value)
    return sock


def _end(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.terminate()
        try:
            child.wait(END_GRACE_S)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


def _cancel_slurm_job() -> None:
    job = os.environ.get("SLURM_JOB_ID")
    if job and os.environ.get("SLURM_PROCID") == "0":
        try:
            subprocess.run(["scancel", job], timeout=10, capture_output=True)
        except (OSError, subprocess.SubprocessError):
            pass


def main(argv: list[str]) -> int:
    """Run ``CMD`` as the guarded rank. The lifeline's address and key come in the environment
    (``WORKBENCH_LIFELINE``, ``WORKBENCH_LIFELINE_KEY``: Slurm and ipyparallel's SSH launcher
    carry it), not on the command line; every line sent carries an HMAC-SHA256 under the key."""
    if "--" not in argv or argv.index("--") == len(argv) - 1:
        print("usage: python -m workbench.engine.guard -- COMMAND...", file=sys.stderr)
        return 2
    cmd = argv[argv.index("--") + 1 :]
    address = os.environ.pop(wire.ENV_LIFELINE, "")
    key = bytes.fromhex(os.environ.pop(wire.ENV_LIFELINE_KEY, ""))
    if not address or not key:
        print(f"workbench guard: {wire.ENV_LIFELINE} and {wire.ENV_LIFELINE_KEY} must be set", file=sys.stderr)
        return 2
    try:
        sock = _connect(address)
    except OSError as exc:
        print(
            f"workbench guard on {socket.gethostname()}: cannot reach the notebook at {address} ({exc}); "
            "that address must be open to this host (pass --ip with the notebook's address toward it)",
            file=sys.stderr,
            flush=True,
        )
        return 3
    os.environ.pop("PYTEST_CURRENT_TEST", None)  # the engine captures its fds (see preload.RANK_ENV_DROPPED)
    child = subprocess.Popen(cmd)
    host = socket.gethostname()
    lock = threading.Lock()

    def send(**msg) -> None:
        with lock:
            try:
                sock.sendall(wire.sign(key, json.dumps(msg)))
            except OSError:
                pass

    send(
        kind="hello",
        host=host,
        pid=child.pid,
        guard_pid=os.getpid(),
        slot=os.environ.get(wire.ENV_HOST_SLOT),
        slurm_procid=os.environ.get("SLURM_PROCID"),
        time=time.time(),
    )
    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):  # scancel / stop: pass it on
        signal.signal(sig, lambda s, _f: child.poll() is None and child.send_signal(s))

    ending = threading.Event()  # the notebook is gone: main ends the rank and the job itself

    def wait_child() -> None:
        code = child.wait()
        send(kind="exit", host=host, pid=child.pid, code=code, time=time.time())
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass
        if not ending.is_set():
            os._exit(128 - code if code < 0 else code)

    threading.Thread(target=wait_child, daemon=True).start()

    def beat() -> None:
        while not ending.wait(wire.BEAT_S):
            send(kind="beat")

    threading.Thread(target=beat, daemon=True).start()
    while True:  # the notebook never writes: any return from recv is its end closing
        try:
            data = sock.recv(64)
        except InterruptedError:
            continue
        except OSError:
            data = b""
        if not data:
            break
    ending.set()
    if child.poll() is None:
        print(
            f"workbench guard on {host}: the notebook at {address} is gone; ending rank pid {child.pid}",
            file=sys.stderr,
            flush=True,
        )
    _end(child)
    _cancel_slurm_job()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
