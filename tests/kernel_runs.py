"""A real Jupyter kernel for the tests that drive one (cells, interrupts): start it, run code in
it and read back every iopub message, and stop its ranks and the kernel afterwards."""

from __future__ import annotations

import contextlib
import os
import time

from jupyter_client.manager import start_new_kernel


def execute(kc, code: str, timeout: float = 180):
    """Run code in the kernel; return (reply content, [(arrival time, iopub msg)])."""
    msg_id = kc.execute(code)
    msgs = []
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        msgs.append((time.time(), msg))
        if msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    while True:  # skip replies to earlier requests (the kernel_info of the start)
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], msgs


def streams(msgs, name: str = "stdout") -> str:
    return "".join(m["content"]["text"] for _, m in msgs if m["msg_type"] == "stream" and m["content"]["name"] == name)


def printed(msgs) -> str:
    """Everything the cell printed (both streams) and the tracebacks of its errors, in order."""
    parts = []
    for _, m in msgs:
        if m["msg_type"] == "stream":
            parts.append(m["content"]["text"])
        elif m["msg_type"] == "error":
            parts.append("\n".join(m["content"]["traceback"]))
    return "".join(parts)


@contextlib.contextmanager
def kernel():
    """(manager, client) of a fresh python3 kernel; its ranks are stopped and it is shut down after."""
    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
    try:
        yield km, kc
    finally:
        try:
            execute(kc, "import workbench; workbench.stop()", timeout=60)
        finally:
            kc.stop_channels()
            km.shutdown_kernel(now=True)


class DebugClient:
    """JupyterLab's side of the kernel's debugger: ``debug_request`` messages on the control
    channel, ``debug_event`` messages read from IOPub (the other IOPub messages are kept in
    ``msgs`` with their arrival time, for :func:`streams`)."""

    def __init__(self, kc):
        self.kc = kc
        self.seq = 0
        self.events: list[dict] = []
        self.msgs: list[tuple[float, dict]] = []

    def request(self, command: str, timeout: float = 60, **arguments) -> dict:
        """Send a request; its response (``success``, ``body``, ``message``)."""
        import queue

        self.seq += 1
        content = {"type": "request", "seq": self.seq, "command": command, "arguments": arguments}
        msg = self.kc.session.msg("debug_request", content)
        self.kc.control_channel.send(msg)
        deadline = time.monotonic() + timeout
        while True:
            try:
                reply = self.kc.control_channel.get_msg(timeout=0.2)
            except queue.Empty:
                self.read()  # events keep coming meanwhile
                if time.monotonic() > deadline:
                    raise TimeoutError(f"no reply to {command!r} in {timeout} s") from None
                continue
            if reply["parent_header"].get("msg_id") == msg["header"]["msg_id"]:
                return reply["content"]

    def start(self) -> None:
        """What JupyterLab does when its debugger is switched on."""
        reply = self.request(
            "initialize",
            clientID="jupyterlab",
            clientName="JupyterLab",
            adapterID="python",
            pathFormat="path",
            linesStartAt1=True,
            columnsStartAt1=True,
        )
        assert reply["success"], reply
        assert self.request("attach")["success"]
        assert self.request("debugInfo")["body"]["isStarted"]
        assert self.request("configurationDone")["success"]

    def stop(self) -> None:
        self.request("disconnect", restart=False, terminateDebuggee=False)

    def breakpoints(self, code: str, lines: list[int]) -> tuple[str, dict]:
        """Set breakpoints on ``lines`` of the cell ``code`` as JupyterLab does (dump the cell,
        then set them on its path): (the cell's path, the response)."""
        path = self.request("dumpCell", code=code)["body"]["sourcePath"]
        reply = self.request("setBreakpoints", source={"path": path}, breakpoints=[{"line": n} for n in lines])
        return path, reply

    def read(self, timeout: float = 0.05) -> None:
        import queue

        while True:
            try:
                msg = self.kc.get_iopub_msg(timeout=timeout)
            except queue.Empty:
                return
            self.msgs.append((time.time(), msg))
            if msg["msg_type"] == "debug_event":
                self.events.append(msg["content"])
            timeout = 0.01

    def event(self, name: str, timeout: float = 60) -> dict:
        """The next ``name`` event (the ones before it of other names are dropped)."""
        deadline = time.monotonic() + timeout
        while True:
            while self.events:
                event = self.events.pop(0)
                if event["event"] == name:
                    return event
            if time.monotonic() > deadline:
                raise TimeoutError(f"no {name!r} event in {timeout} s")
            self.read(0.2)

    def finished(self, msg_id: str, timeout: float = 120) -> list[tuple[float, dict]]:
        """Wait until the request ``msg_id`` is done; its IOPub messages."""
        deadline = time.monotonic() + timeout
        while True:
            mine = [(t, m) for t, m in self.msgs if m["parent_header"].get("msg_id") == msg_id]
            if any(m["msg_type"] == "status" and m["content"]["execution_state"] == "idle" for _, m in mine):
                return mine
            if time.monotonic() > deadline:
                raise TimeoutError(f"the cell did not finish in {timeout} s")
            self.read(0.2)
