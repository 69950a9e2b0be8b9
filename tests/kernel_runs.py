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
