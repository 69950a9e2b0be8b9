"""Tier 4: a real Jupyter kernel; interrupting the notebook interrupts the ranks."""

import queue
import time

import kernel_runs
import pytest


def execute(kc, code, timeout=120):
    """Run code in the kernel; return (reply content, text printed)."""
    reply, msgs = kernel_runs.execute(kc, code, timeout)
    return reply, kernel_runs.printed(msgs)


@pytest.fixture
def kernel():
    with kernel_runs.kernel() as (km, kc):
        yield km, kc


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
