"""Tier 4: a real Jupyter kernel; interrupting the notebook interrupts the ranks."""
import os
import queue
import time

import pytest
from jupyter_client.manager import start_new_kernel


def execute(kc, code, timeout=120):
    """Run code in the kernel; return (reply content, text printed)."""
    msg_id = kc.execute(code)
    text = []
    deadline = time.monotonic() + timeout
    while True:
        msg = kc.get_iopub_msg(timeout=max(1, deadline - time.monotonic()))
        if msg["parent_header"].get("msg_id") != msg_id:
            continue
        if msg["msg_type"] == "stream":
            text.append(msg["content"]["text"])
        elif msg["msg_type"] == "error":
            text.append("\n".join(msg["content"]["traceback"]))
        elif msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle":
            break
    reply = kc.get_shell_msg(timeout=timeout)
    return reply["content"], "".join(text)


@pytest.fixture
def kernel():
    km, kc = start_new_kernel(kernel_name="python3", env=dict(os.environ))
    yield km, kc
    try:
        execute(kc, "import workbench; workbench.stop()", timeout=60)
    finally:
        kc.stop_channels()
        km.shutdown_kernel(now=True)


def test_interrupting_the_kernel_interrupts_every_rank(kernel):
    km, kc = kernel
    reply, out = execute(kc, "%load_ext workbench\n%distrain start -n 2 --backend gloo --threads 1")
    assert reply["status"] == "ok", out
    msg_id = kc.execute("%%distrain\nspins = 0\nwhile True:\n    spins += 1")
    time.sleep(3)
    km.interrupt_kernel()
    deadline = time.monotonic() + 30
    reply = None
    while time.monotonic() < deadline:
        try:
            msg = kc.get_shell_msg(timeout=1)
        except queue.Empty:
            continue
        if msg["parent_header"].get("msg_id") == msg_id:
            reply = msg["content"]
            break
    assert reply is not None, "the interrupted cell never finished"
    assert reply["status"] == "error" and reply["ename"] == "Interrupted"
    reply, out = execute(kc, "%%distrain\nprint('spun', spins > 0)")
    assert reply["status"] == "ok"
    assert "[rank 0] spun True" in out and "[rank 1] spun True" in out
