"""Tier 4: through a real Jupyter kernel, output is live from the first line and a failing
rank is shown at once (2 ranks started in the kernel)."""

import re
import time

import kernel_runs
import pytest
from kernel_runs import execute, streams


@pytest.fixture(scope="module")
def kernel():
    with kernel_runs.kernel() as (km, kc):
        reply, msgs = execute(kc, "%load_ext workbench\n%distrain start -n 2 --backend gloo --threads 1")
        assert reply["status"] == "ok", streams(msgs, "stderr")
        yield kc


def test_output_is_live_from_the_first_line_then_regrouped(kernel):
    reply, msgs = execute(
        kernel,
        "%%distrain\nimport time\nfrom workbench import engine\n"
        "print('first', engine.rank, flush=True)\ntime.sleep(4)\n"
        "print('second', engine.rank)",
    )
    assert reply["status"] == "ok"
    t_idle = msgs[-1][0]
    live = [
        (t, m)
        for t, m in msgs
        if m["msg_type"] == "display_data" and "[rank 0] first 0" in m["content"]["data"].get("text/plain", "")
    ]
    assert live, "no live output while the cell ran"
    assert live[0][0] < t_idle - 2.0, "the first line only showed up at the end"
    display_id = live[0][1]["content"]["transient"]["display_id"]
    updates = [
        m["content"]["data"]["text/plain"]
        for _, m in msgs
        if m["msg_type"] == "update_display_data" and m["content"]["transient"]["display_id"] == display_id
    ]
    assert updates and updates[-1] == "", "the live display was not emptied at the end"
    out = streams(msgs)
    lines = [line for line in out.splitlines() if line.startswith("[rank")]
    assert lines == ["[rank 0] first 0", "[rank 0] second 0", "[rank 1] first 1", "[rank 1] second 1"]


def test_a_quick_cell_opens_no_live_display(kernel):
    reply, msgs = execute(kernel, "%%distrain\nprint('quick')")
    assert reply["status"] == "ok"
    assert not [m for _, m in msgs if m["msg_type"] in ("display_data", "update_display_data")]
    assert streams(msgs).splitlines() == ["[rank 0] quick", "[rank 1] quick"]


def test_a_flood_keeps_the_live_display_and_the_cells_output_bounded(kernel):
    """100,000 lines per rank over ~2.5 s: the live display shows the head and how much was cut
    so far (never more than the cell keeps), the cell's output a head, a cut line and a tail."""
    reply, msgs = execute(
        kernel,
        "%%distrain --output 64k\nimport time\nfor k in range(25):\n    for i in range(4000):\n"
        "        print(f'step {k * 4000 + i} loss 0.25')\n    time.sleep(0.1)\n",
    )
    assert reply["status"] == "ok"
    live = [
        m["content"]["data"]["text/plain"] for _, m in msgs if m["msg_type"] in ("display_data", "update_display_data")
    ]
    assert live and max(len(t) for t in live) <= 64 * 2**10 + 1000, max(len(t) for t in live)
    progress = [t for t in live if "cut so far" in t]
    assert progress, "the live display never said what was being cut"
    assert re.search(r"\[rank 1\] … [\d,]+ lines \(.*\) cut so far .*latest: step \d+ loss 0\.25", progress[-1])
    out = streams(msgs)
    assert len(out) <= 64 * 2**10 + 1000
    for rank in (0, 1):
        cut = [line for line in out.splitlines() if line.startswith(f"[rank {rank}] … ") and "cut here" in line]
        assert len(cut) == 1, out[-2000:]
        assert out.rstrip().endswith("step 99999 loss 0.25")


def test_failing_rank_traceback_within_a_second_while_the_other_waits(kernel):
    reply, msgs = execute(
        kernel,
        "%%distrain --grace 2\nimport time, torch, torch.distributed as dist\n"
        "t = torch.ones(1)\nif dist.get_rank() == 1:\n"
        "    raise ValueError(f'boom at {time.time()!r}')\n"
        "dist.all_reduce(t)\n",
    )
    assert reply["status"] == "error" and reply["ename"] == "RankFailure"
    assert reply["evalue"].startswith("rank 1 failed first: ValueError: boom at")
    raised_at = float(re.search(r"boom at ([0-9.]+)", reply["evalue"]).group(1))
    shown = [
        t
        for t, m in msgs
        if m["msg_type"] == "stream"
        and m["content"]["name"] == "stderr"
        and "[rank 1]" in m["content"]["text"]
        and "boom at" in m["content"]["text"]
    ]
    assert shown and shown[0] - raised_at < 1.0
    assert msgs[-1][0] - raised_at >= 2.0  # the other rank had its grace
    reply, msgs = execute(kernel, "%%distrain\nt = torch.ones(1)\ndist.all_reduce(t)\nprint(t.item())")
    assert reply["status"] == "ok"
    assert streams(msgs).splitlines() == ["[rank 0] 2.0", "[rank 1] 2.0"]


def test_auto_mode_round_trip_in_a_kernel(kernel):
    try:
        reply, msgs = execute(kernel, "%distrain auto on")
        assert reply["status"] == "ok" and "auto mode on" in streams(msgs)
        reply, msgs = execute(kernel, "auto_x = 5\nprint('x', auto_x)")
        assert reply["status"] == "ok"
        out = streams(msgs).splitlines()
        assert out[0].startswith("[auto] on the ranks") and out[1:] == ["[rank 0] x 5", "[rank 1] x 5"]
        reply, msgs = execute(kernel, "%%local\nprint('here', 'auto_x' in dir())")
        assert reply["status"] == "ok" and streams(msgs) == "here False\n"
    finally:
        reply, msgs = execute(kernel, "%distrain auto off")
    assert reply["status"] == "ok" and "auto mode off" in streams(msgs)
    reply, msgs = execute(kernel, "print('plain again')")
    assert streams(msgs) == "plain again\n"


def test_tqdm_on_rank_0_is_one_live_bar(kernel):
    reply, msgs = execute(
        kernel,
        "%%distrain\nimport time\nfrom tqdm import tqdm\nfrom workbench import engine\n"
        "for i in tqdm(range(40), disable=engine.rank != 0, mininterval=0.05):\n"
        "    time.sleep(0.1)\n",
    )
    assert reply["status"] == "ok"
    opened = [m for _, m in msgs if m["msg_type"] == "display_data"]
    assert len(opened) == 1, "the bar should be one display"
    display_id = opened[0]["content"]["transient"]["display_id"]
    states = [
        m["content"]["data"]["text/plain"]
        for _, m in msgs
        if m["msg_type"] in ("display_data", "update_display_data")
        and m["content"]["transient"]["display_id"] == display_id
    ]
    bars = [s for s in states if s]
    assert all(len([l for l in s.splitlines() if "%|" in l]) == 1 for s in bars), bars
    assert all(s.startswith("[rank 0] ") for s in bars)
    counts = {re.search(r"(\d+)/40", s).group(1) for s in bars}
    assert len(counts) >= 3, f"the bar was not updated while it ran: {counts}"
    assert states[-1] == ""  # emptied at the end; the final bar is in the output once:
    final = [l for l in streams(msgs, "stderr").splitlines() if "%|" in l]
    assert len(final) == 1 and final[0].startswith("[rank 0] 100%") and "40/40" in final[0]


def drive_pdb(kc, code, commands, timeout=120):
    """Run code; answer each input request with the next command. Returns (reply, iopub msgs, prompts)."""
    import queue

    msg_id = kc.execute(code, allow_stdin=True)
    prompts, msgs = [], []
    deadline = time.monotonic() + timeout
    todo = list(commands)
    idle = False
    while not idle and time.monotonic() < deadline:
        try:
            req = kc.get_stdin_msg(timeout=0.1)
        except queue.Empty:
            req = None
        while True:  # output printed before an input request can arrive after it: take it first
            try:
                msg = kc.get_iopub_msg(timeout=0.3 if req else 0.05)
            except queue.Empty:
                break
            if msg["parent_header"].get("msg_id") == msg_id:
                msgs.append((time.time(), msg))
                idle = msg["msg_type"] == "status" and msg["content"]["execution_state"] == "idle"
        if req is not None:
            prompts.append((req["content"]["prompt"], len(msgs)))
            kc.input(todo.pop(0) if todo else "c")
    assert idle, "the cell never finished"
    assert not todo, f"commands never asked for: {todo}"
    while True:
        reply = kc.get_shell_msg(timeout=timeout)
        if reply["parent_header"].get("msg_id") == msg_id:
            return reply["content"], msgs, prompts


def output_between(msgs, start, end) -> str:
    return "".join(m["content"]["text"] for _, m in msgs[start:end] if m["msg_type"] == "stream")


def test_breakpoint_on_rank_1_of_2_p_n_c_through_the_notebook(kernel):
    code = (
        "%%distrain\nfrom workbench import engine\nx = 41 + engine.rank\n"
        "if engine.rank == 1:\n    breakpoint()\n    y = x + 1\n    z = y * 2\nprint('done', x)\n"
        "import torch.distributed as dist\ndist.barrier()"
    )
    reply, msgs, prompts = drive_pdb(kernel, code, ["p x", "n", "p y", "c"])
    assert reply["status"] == "ok"
    assert [p for p, _ in prompts] == ["(Pdb rank 1) "] * 4
    stops = [i for _, i in prompts]
    assert "[rank 1] stopped in pdb; rank 0 still running (waiting)" in output_between(msgs, 0, stops[0])
    assert "[rank 1] 42" in output_between(msgs, stops[0], stops[1])  # p x
    assert "-> y = x + 1" in output_between(msgs, 0, stops[0])  # stopped after breakpoint()
    assert "-> z = y * 2" in output_between(msgs, stops[1], stops[2])  # n: at the next line
    assert "[rank 1] 43" in output_between(msgs, stops[2], stops[3])  # p y
    assert "[rank 0] done 41" in streams(msgs) and "[rank 1] done 42" in streams(msgs)


def test_post_mortem_on_a_rank(kernel):
    reply, _ = execute(kernel, "%%distrain --ranks 1\nz = 5\n1 / 0")
    assert reply["status"] == "error"
    reply, msgs, prompts = drive_pdb(kernel, "%distrain debug --ranks 1", ["p z", "q"])
    assert reply["status"] == "ok"
    assert [p for p, _ in prompts] == ["(Pdb rank 1) "] * 2
    before = output_between(msgs, 0, prompts[0][1])
    assert "[rank 1] post-mortem: ZeroDivisionError: division by zero" in before and "-> 1 / 0" in before
    assert "[rank 1] 5" in output_between(msgs, prompts[0][1], prompts[1][1])
    reply, msgs, prompts = drive_pdb(kernel, "%distrain debug --ranks 7", [])
    assert reply["status"] == "error" and "--ranks 7: rank(s) 7 do not exist" in reply["evalue"]
