"""Tier 4: JupyterLab's debugger on the ranks, driven as JupyterLab drives it (debug requests
on a real kernel's control channel, events read from IOPub), on 2 real ranks started in it."""

import time

import kernel_runs
import pytest
from kernel_runs import DebugClient, execute, streams

from workbench.notebook.debugger import cells

CELL = (
    "%%distrain\n"
    "from workbench import engine\n"
    "rank = engine.rank\n"
    "x = rank * 10\n"  # line 4: the breakpoint
    "y = x + 1\n"
    "print('rank', rank, 'y', y)\n"
)


@pytest.fixture(scope="module")
def kernel():
    with kernel_runs.kernel() as (km, kc):
        reply, msgs = execute(kc, "%load_ext workbench\n%distrain start -n 2 --backend gloo --threads 1")
        assert reply["status"] == "ok", streams(msgs, "stderr")
        kc.manager = km  # the interrupt test's
        yield kc


@pytest.fixture
def debug(kernel):
    """The debugger switched on (as the bug icon does), and off again after the test."""
    client = DebugClient(kernel)
    client.start()
    yield client
    client.stop()


def names(variables) -> dict:
    return {v["name"]: v for v in variables}


def frames_of(debug, event) -> list[dict]:
    reply = debug.request("stackTrace", threadId=event["body"]["threadId"])
    assert reply["success"], reply
    return reply["body"]["stackFrames"]


def variables(debug, frame_id) -> dict:
    """Selecting a frame in the call stack: its scopes, then the first scope's variables."""
    scopes = debug.request("scopes", frameId=frame_id)["body"]["scopes"]
    reply = debug.request("variables", variablesReference=scopes[0]["variablesReference"])
    return names(reply["body"]["variables"])


def test_a_breakpoint_stops_both_ranks_and_steps_act_on_all_then_on_the_chosen_rank(debug):
    path, reply = debug.breakpoints(CELL, [4])
    assert reply["body"]["breakpoints"] == [{"verified": True, "line": 4, "source": {"path": path}}]
    msg_id = debug.kc.execute(CELL)
    stopped = debug.event("stopped")
    assert stopped["body"]["reason"] == "breakpoint"
    assert stopped["body"]["description"] == "ranks 0-1 stopped at line 4"
    # JupyterLab takes an IOPub message of the running cell as "nothing is stopped" and would
    # show the kernel's variables for the rank's: the ranks' events never name the cell
    parents = {m["parent_header"].get("msg_type") for _, m in debug.msgs if m["msg_type"] == "debug_event"}
    assert "execute_request" not in parents and "debug_request" in parents
    frames = frames_of(debug, stopped)
    assert [(f["name"], f["line"], f["source"]["path"]) for f in frames] == [
        ("[ranks 0-1] every stopped rank", 4, path),
        ("[rank 0] <module>", 4, path),
        ("[rank 1] <module>", 4, path),
    ]
    threads = debug.request("threads")["body"]["threads"]
    assert {t["name"]: t["id"] for t in threads if t["name"].startswith("rank ")} == {
        "rank 0": cells.rank_thread(0),
        "rank 1": cells.rank_thread(1),
    }
    # the entry of every rank: one scope per rank; each rank's own frame: its locals
    scopes = debug.request("scopes", frameId=frames[0]["id"])["body"]["scopes"]
    assert [s["name"] for s in scopes] == ["rank 0", "rank 1"]
    for rank, scope in enumerate(scopes):
        got = names(debug.request("variables", variablesReference=scope["variablesReference"])["body"]["variables"])
        assert got["rank"]["value"] == str(rank) and "x" not in got  # line 4 has not run yet
    for rank, frame in enumerate(frames[1:]):
        got = variables(debug, frame["id"])
        assert got["rank"]["value"] == str(rank)
        engine = debug.request("variables", variablesReference=got["engine"]["variablesReference"])
        assert names(engine["body"]["variables"])["rank"]["value"] == str(rank)  # engine.rank, opened
    assert debug.request("evaluate", expression="rank + 100", frameId=frames[0]["id"], context="repl")["body"][
        "result"
    ] == ("[rank 0] 100\n[rank 1] 101")
    # step with the entry of every rank selected: both go on to line 5
    debug.request("scopes", frameId=frames[0]["id"])
    assert debug.request("next", threadId=stopped["body"]["threadId"])["success"]
    debug.event("continued")
    stopped = debug.event("stopped")
    assert stopped["body"]["description"] == "ranks 0-1 stopped at line 5"
    frames = frames_of(debug, stopped)
    assert [(f["name"], f["line"]) for f in frames][1:] == [("[rank 0] <module>", 5), ("[rank 1] <module>", 5)]
    # rank 1 chosen: the step is rank 1's alone, and rank 1 comes first in the call stack
    assert variables(debug, frames[2]["id"])["x"]["value"] == "10"
    assert debug.request("next", threadId=stopped["body"]["threadId"])["success"]
    debug.event("continued")
    stopped = debug.event("stopped")
    assert stopped["body"]["threadId"] == cells.rank_thread(1)
    frames = frames_of(debug, stopped)
    assert [(f["name"], f["line"]) for f in frames] == [
        ("[rank 1] <module>", 6),
        ("[ranks 0-1] every stopped rank", 5),
        ("[rank 0] <module>", 5),
    ]
    assert variables(debug, frames[0]["id"])["y"]["value"] == "11"
    # continue rank 1 alone: rank 0 is shown stopped on its own, then continued too
    assert debug.request("continue", threadId=stopped["body"]["threadId"])["success"]
    debug.event("continued")
    stopped = debug.event("stopped")
    assert stopped["body"]["description"] == "rank 0 stopped at line 5"
    frames = frames_of(debug, stopped)
    assert [(f["name"], f["line"]) for f in frames] == [("[rank 0] <module>", 5)]
    # JupyterLab's continue names the thread it has just dropped from its stopped ones: 1
    assert debug.request("continue", threadId=1)["success"]
    out = streams(debug.finished(msg_id))
    assert out.splitlines() == ["[rank 0] rank 0 y 1", "[rank 1] rank 1 y 11"]


def test_breakpoints_in_a_function_of_an_earlier_cell_and_breakpoint_call(debug):
    define = "%%distrain\ndef scaled(v):\n    w = v * 3\n    return w\n"
    reply, msgs = execute(debug.kc, define)
    assert reply["status"] == "ok"
    path, reply = debug.breakpoints(define, [3])
    assert reply["body"]["breakpoints"][0]["verified"]
    call = (
        "%%distrain --ranks 1\nfrom workbench import engine\nz = scaled(engine.rank + 1)\nbreakpoint()\nprint('z', z)\n"
    )
    msg_id = debug.kc.execute(call)
    stopped = debug.event("stopped")
    assert stopped["body"]["description"] == "rank 1 stopped at line 3"
    frames = frames_of(debug, stopped)
    call_path = debug.request("dumpCell", code=call)["body"]["sourcePath"]
    assert [(f["name"], f["line"], f["source"]["path"]) for f in frames] == [
        ("[rank 1] scaled", 3, path),  # the earlier cell's line, in the notebook's terms
        ("[rank 1] <module>", 3, call_path),
    ]
    assert variables(debug, frames[0]["id"])["v"]["value"] == "2"
    assert debug.request("stepOut", threadId=stopped["body"]["threadId"])["success"]
    stopped = debug.event("stopped")  # back in the calling cell, after the call
    assert [(f["name"], f["line"]) for f in frames_of(debug, stopped)] == [("[rank 1] <module>", 4)]
    assert debug.request("continue", threadId=stopped["body"]["threadId"])["success"]
    stopped = debug.event("stopped")  # breakpoint(): in the visual debugger while it is on
    assert stopped["body"]["reason"] == "breakpoint"
    assert [(f["name"], f["line"]) for f in frames_of(debug, stopped)] == [("[rank 1] <module>", 5)]
    assert debug.request("continue", threadId=stopped["body"]["threadId"])["success"]
    assert streams(debug.finished(msg_id)) == "[rank 1] z 6\n"


def test_a_breakpoint_on_the_magic_line_is_refused_and_a_plain_cell_debugs_in_the_kernel(debug):
    _, reply = debug.breakpoints(CELL, [1])
    (point,) = reply["body"]["breakpoints"]
    assert not point["verified"] and "runs in the notebook" in point["message"]
    debug.breakpoints(CELL, [])
    plain = "a = 5\nb = a * 2\nprint('b', b)\n"
    path, reply = debug.breakpoints(plain, [2])
    assert reply["success"]
    msg_id = debug.kc.execute(plain)
    stopped = debug.event("stopped")
    assert cells.thread_rank(stopped["body"]["threadId"]) is None  # the kernel's own thread (debugpy)
    frames = frames_of(debug, stopped)
    assert (frames[0]["line"], frames[0]["source"]["path"]) == (2, path)
    assert debug.request("continue", threadId=stopped["body"]["threadId"])["success"]
    assert streams(debug.finished(msg_id)) == "b 10\n"
    debug.breakpoints(plain, [])


def test_an_uncaught_exception_stops_the_rank_that_raised(debug):
    assert debug.request("setExceptionBreakpoints", filters=["uncaught"])["success"]
    code = "%%distrain\nfrom workbench import engine\nq = 7 - engine.rank * 7\nif engine.rank == 1:\n    r = 1 / q\n"
    msg_id = debug.kc.execute(code)
    stopped = debug.event("stopped")
    assert stopped["body"]["reason"] == "exception"
    assert stopped["body"]["description"] == "rank 1 stopped at line 5"
    assert stopped["body"]["text"] == "ZeroDivisionError: division by zero"
    frames = frames_of(debug, stopped)
    assert variables(debug, frames[0]["id"])["q"]["value"] == "0"
    assert debug.request("continue", threadId=stopped["body"]["threadId"])["success"]
    msgs = debug.finished(msg_id)
    assert any(m["msg_type"] == "error" and m["content"]["ename"] == "RankFailure" for _, m in msgs)
    assert debug.request("setExceptionBreakpoints", filters=[])["success"]


def test_time_stopped_is_not_the_cells_and_switching_the_debugger_off_lets_the_ranks_go(debug):
    code = CELL.replace("%%distrain\n", "%%distrain --timeout 2\n")
    debug.breakpoints(code, [4])
    msg_id = debug.kc.execute(code)
    stopped = debug.event("stopped")
    time.sleep(3)  # past the cell's timeout, stopped
    assert [f["line"] for f in frames_of(debug, stopped)] == [4, 4, 4]
    debug.stop()  # the bug icon off: the ranks run to the end and stop no more
    msgs = debug.finished(msg_id)
    assert not [m for _, m in msgs if m["msg_type"] == "error"]
    assert streams(msgs).splitlines() == ["[rank 0] rank 0 y 1", "[rank 1] rank 1 y 11"]
    debug.start()


def test_an_interrupt_while_the_ranks_are_stopped_ends_the_cell_and_the_ranks_go_on(debug):
    debug.breakpoints(CELL, [4])
    msg_id = debug.kc.execute(CELL)
    debug.event("stopped")
    debug.kc.manager.interrupt_kernel()
    msgs = debug.finished(msg_id)
    errors = [m["content"] for _, m in msgs if m["msg_type"] == "error"]
    assert [e["ename"] for e in errors] == ["Interrupted"]
    debug.event("continued")  # the stop shown is over
    debug.breakpoints(CELL, [])
    reply, msgs = execute(debug.kc, "%%distrain\nprint('still here', rank)")
    assert reply["status"] == "ok" and streams(msgs).splitlines() == ["[rank 0] still here 0", "[rank 1] still here 1"]


def test_in_auto_mode_a_plain_cells_breakpoint_stops_the_ranks(debug):
    reply, _ = execute(debug.kc, "%distrain auto on")
    assert reply["status"] == "ok"
    try:
        code = "from workbench import engine\nw = engine.rank + 5\nprint('w', w)\n"
        path, reply = debug.breakpoints(code, [3])
        assert reply["body"]["breakpoints"][0]["verified"]
        msg_id = debug.kc.execute(code)
        stopped = debug.event("stopped")
        assert stopped["body"]["description"] == "ranks 0-1 stopped at line 3"
        frames = frames_of(debug, stopped)
        assert {(f["line"], f["source"]["path"]) for f in frames} == {(3, path)}  # the cell's own lines
        assert debug.request("continue", threadId=1)["success"]
        assert streams(debug.finished(msg_id)).splitlines()[1:] == ["[rank 0] w 5", "[rank 1] w 6"]
        debug.breakpoints(code, [])
    finally:
        execute(debug.kc, "%distrain auto off")
