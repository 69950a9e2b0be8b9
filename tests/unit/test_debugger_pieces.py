"""The pieces of JupyterLab's debugger on the ranks that need no process: the ids and cell
lines (notebook side), the signed wire, the values shown, and the rank's debugger itself run
on a thread of this process, its link replaced by a queue (the real link: tests/notebooks)."""

from __future__ import annotations

import itertools
import linecache
import os
import queue
import sys
import threading
import time
import types

import pytest

from workbench.engine import cell_debugger, debug_link, debug_values
from workbench.notebook.debugger import cells
from workbench.shared import debug_wire


# ---------------------------------------------------------------------- notebook side: ids, cells
def test_rank_ids_never_meet_the_kernels_and_stay_exact_in_a_browser():
    assert cells.rank_thread(0) > 1_000_000  # debugpy numbers its threads 1, 2, ...
    for rank, local in [(0, 0), (1, 1), (63, 2**32 - 1), (100_000, 7)]:
        ref = cells.encode(rank, local)
        assert ref >= 2**47  # above any address: debugpy's frame and variable ids are id()s
        assert ref < 2**53  # a JavaScript number holds it exactly
        assert cells.decode(ref) == (rank, local)
    assert cells.decode(id(object())) is None and cells.decode(5) is None
    assert cells.thread_rank(cells.rank_thread(3)) == 3 and cells.thread_rank(cells.THREAD_BASE) == "all"
    assert cells.thread_rank(1) is None and cells.decode(cells.ALL_FRAME) is None
    with pytest.raises(ValueError):
        cells.encode(0, 2**32)


def test_which_cells_run_on_the_ranks_and_where_their_code_starts():
    assert cells.magic_line("%%distrain --ranks 0\nx = 1") == 0
    assert cells.magic_line("\n  \n%%distrain\nx = 1") == 2
    assert cells.magic_line("%%distrain_auto\nx = 1") is None  # another magic
    assert cells.magic_line("x = 1\n%%distrain") is None
    assert cells.runs_on_ranks("%%distrain\nx = 1")
    assert not cells.runs_on_ranks("x = 1") and cells.runs_on_ranks("x = 1", auto=True)
    assert not cells.runs_on_ranks("%time x = 1", auto=True) and not cells.runs_on_ranks("!ls", auto=True)
    assert cells.origin("/p.py", "%%distrain\nx = 1") == debug_wire.CellOrigin("/p.py", 1)
    assert cells.origin("/p.py", "x = 1") == debug_wire.CellOrigin("/p.py", 0)
    checked = dict(cells.check_lines("%%distrain\nx = 1\ny = 2", 1, [1, 2, 3, 4]))
    assert checked[2] is None and checked[3] is None
    assert "runs in the notebook" in checked[1] and checked[4] == "the cell has 3 lines"


# ---------------------------------------------------------------------- the wire
def test_the_wire_refuses_a_wrong_key_a_changed_byte_and_a_replay():
    key = b"k" * 32
    frames = debug_wire.pack(key, {"op": "hello", "seq": 1})
    assert debug_wire.unpack(key, frames) == {"op": "hello", "seq": 1}
    assert debug_wire.unpack(b"other", frames) is None
    assert debug_wire.unpack(key, [frames[0], frames[1].replace(b"hello", b"hellO")]) is None
    assert debug_wire.unpack(key, [frames[1]]) is None
    replay = debug_wire.Replay()
    assert replay.fresh("a", 1) and replay.fresh("a", 2) and replay.fresh("b", 1)
    assert not replay.fresh("a", 2) and not replay.fresh("a", 1) and not replay.fresh("a", "3")


# ---------------------------------------------------------------------- values
def test_values_hide_the_shells_names_and_open_what_holds_values():
    refs = debug_values.Refs()
    ns = {"x": 1, "_": 2, "_i3": "x", "In": [], "__session__": "s", "_mine": len, "data": {"a": [1, 2]}}
    ns["_14f14336_9489f9109c7c841c30d39ccf_442_5_args"] = ()
    shown = debug_values.scope_variables(ns, refs)
    assert [v["name"] for v in shown] == ["data", "x", "_mine"]
    data = shown[0]
    assert data["variablesReference"] and data["value"] == "{'a': [1, 2]}"
    kind, obj = refs.get(data["variablesReference"])
    (a,) = debug_values.child_variables(kind, obj, refs)
    assert (a["name"], a["value"]) == ("'a'", "[1, 2]")
    assert [v["value"] for v in debug_values.child_variables(*refs.get(a["variablesReference"]), refs)] == ["1", "2"]
    module = types.ModuleType("m")
    module.rank, module._hidden = 3, 4
    assert [(v["name"], v["value"]) for v in debug_values.child_variables("value", module, refs)] == [("rank", "3")]
    assert debug_values.text("x" * 5000).endswith("…") and len(debug_values.text("x" * 5000)) == debug_values.TEXT_MAX
    with pytest.raises(KeyError, match="moved on"):
        refs.get(999)


# ---------------------------------------------------------------------- the rank's debugger
class Notebook:
    """The notebook's end of a rank's link, in this process: the rank's messages arrive on a
    queue, requests go to the rank's handler as the link's thread hands them."""

    def __init__(self, monkeypatch):
        self.inbox: queue.Queue = queue.Queue()
        self.handlers: dict = {}
        self.stop = None
        self._ids = itertools.count(1)
        self.seen: list[dict] = []
        monkeypatch.setattr(debug_link, "open_for", self._open)
        monkeypatch.setattr(debug_link, "close_for", lambda name, link: None)

    def _open(self, name, handler):
        self.handlers[name] = handler
        return self

    def send(self, message):  # the rank's side of the link
        self.inbox.put(message)

    def next(self, op: str, timeout: float = 10) -> dict:
        while True:
            message = self.inbox.get(timeout=timeout)
            self.seen.append(message)
            if message.get("op") == "stopped":
                self.stop = message["stop"]
            if message.get("op") == op:
                return message

    def ask(self, command: str, **arguments) -> dict:
        rid = next(self._ids)
        request = {"op": "request", "id": rid, "to": "debugger", "command": command, "arguments": arguments}
        self.handlers["debugger"]({**request, "stop": self.stop})
        while True:
            message = self.next("reply")
            if message["id"] == rid:
                assert message["success"], message
                return message["body"]

    def where(self) -> list[tuple[str, int]]:
        return [(f["name"], f["line"]) for f in self.ask("stackTrace")["stackFrames"]]

    def value(self, name: str) -> str:
        scope = self.ask("scopes", frameId=None)["scopes"][0]
        got = {
            v["name"]: v["value"]
            for v in self.ask("variables", variablesReference=scope["variablesReference"])["variables"]
        }
        return got[name]


_CELLS = itertools.count(1)


def cell(code: str) -> tuple[str, str]:
    """(the rank's compiled name, the notebook's path) of a new cell ``code`` (a ``%%distrain``
    line above it in the notebook)."""
    n = next(_CELLS)
    filename, path = f"/tmp/wb-unit-rank/{n}.py", f"/tmp/wb-unit-notebook/{n}.py"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    cell_debugger.note_cell(filename, debug_wire.CellOrigin(path, 1))
    return filename, path


def run(code: str, script, monkeypatch, breakpoints=(), parts: int = 1, namespace=None) -> dict:
    """Run ``code`` as a cell under a fresh rank debugger on this (the main) thread, as a rank
    runs its cells, while ``script(notebook, path)`` plays the notebook on another; the cell's
    namespace after. ``parts``: split as the shell splits a cell whose last statement is an
    expression (the last line alone)."""
    nb = Notebook(monkeypatch)
    filename, path = cell(code)
    dbg = cell_debugger.CellDebugger()
    spec = debug_wire.CellDebug(
        link=None, visual=True, breakpoints=tuple(debug_wire.Breakpoint(path, line) for line in breakpoints)
    )
    ns = {} if namespace is None else namespace
    lines = code.splitlines(True)

    def body():
        try:
            if parts == 1:
                exec(compile(code, filename, "exec"), ns)
            else:
                exec(compile("".join(lines[:-1]), filename, "exec"), ns)
                exec(compile("\n" * (len(lines) - 1) + lines[-1], filename, "single"), ns)
        except Exception:
            kind, value, tb = sys.exc_info()
            dbg.post_mortem(tb, f"{kind.__name__}: {value}")

    failed: list[BaseException] = []

    def play():
        try:
            script(nb, path)
        except BaseException as exc:  # raised here, on the test's thread
            failed.append(exc)
            dbg._released = True
            dbg._commands.put(None)

    player = threading.Thread(target=play, daemon=True)
    player.start()
    dbg.run(spec, filename, 0, body)
    player.join(10)
    if failed:
        raise failed[0]
    assert not player.is_alive(), "the notebook's side never finished"
    return ns


def test_breakpoint_then_next_through_the_shells_parts_to_the_end(monkeypatch):
    def script(nb, path):
        stopped = nb.next("stopped")
        assert (stopped["reason"], stopped["path"], stopped["line"], stopped["cell"]) == ("breakpoint", path, 3, True)
        assert nb.where() == [("<module>", 3)] and nb.value("a") == "1"
        nb.ask("next")
        assert nb.next("stopped")["line"] == 4
        nb.ask("next")  # out of the first part: stops at the next part's line
        stopped = nb.next("stopped")
        assert (stopped["reason"], stopped["line"]) == ("step", 5)
        assert nb.value("c") == "3"
        nb.ask("next")
        nb.next("ended")

    ns = run("a = 1\nb = a + 1\nc = b + 1\nprint(a, b, c)\n", script, monkeypatch, breakpoints=[3], parts=2)
    assert ns["c"] == 3


def test_step_in_and_out_of_a_cells_function_but_not_into_a_library(monkeypatch):
    define, _ = cell("def f(v):\n    w = v * 2\n    return w\n")
    ns: dict = {}
    exec(compile("def f(v):\n    w = v * 2\n    return w\n", define, "exec"), ns)

    def script(nb, path):
        nb.next("stopped")
        nb.ask("stepIn")  # json.dumps is the library's: the step goes over it
        assert nb.next("stopped")["line"] == 4
        nb.ask("stepIn")
        stopped = nb.next("stopped")
        assert stopped["line"] == 3 and stopped["path"] != path  # f's first line, in f's own cell
        assert nb.where() == [("f", 3), ("<module>", 4)]
        assert nb.value("v") == "3"
        nb.ask("stepOut")
        assert nb.next("stopped")["line"] == 5
        assert nb.where() == [("<module>", 5)]
        nb.ask("continue")
        nb.next("ended")

    code = "import json\ns = json.dumps([1])\nz = f(3)\nprint(z)\n"
    assert run(code, script, monkeypatch, breakpoints=[3], namespace=ns)["z"] == 6


def test_pause_a_running_cell_evaluate_there_and_go_on(monkeypatch):
    def script(nb, path):
        nb.next("started")
        nb.handlers["debugger"]({"op": "request", "id": 0, "to": "debugger", "command": "pause", "arguments": {}})
        stopped = nb.next("stopped")
        assert stopped["reason"] == "pause" and stopped["line"] in (3, 4)
        assert nb.ask("evaluate", expression="i > 0")["result"] == "True"
        nb.ask("evaluate", expression="done = True")  # a statement, in the cell's namespace
        nb.ask("continue")
        nb.next("ended")

    ns = run("i = 0\nwhile not done:\n    i += 1\nprint(i)\n", script, monkeypatch, namespace={"done": False})
    assert ns["done"] is True and ns["i"] > 0


def test_a_breakpoint_set_while_it_runs_untraced_stops_it_and_a_condition_holds_it(monkeypatch):
    ns = {"go": False}

    def script(nb, path):
        nb.next("started")
        points = [{"path": path, "line": 7, "condition": "k == 3"}]
        nb.handlers["debugger"](
            {
                "op": "request",
                "id": 0,
                "to": "debugger",
                "command": "setBreakpoints",
                "arguments": {"breakpoints": points},
            }
        )
        nb.next("reply")
        ns["go"] = True
        stopped = nb.next("stopped")
        assert stopped["line"] == 7 and nb.value("k") == "3"
        nb.handlers["debugger"]({"op": "request", "id": 0, "to": "debugger", "command": "release", "arguments": {}})
        nb.next("ended")

    code = "import sys, time\ntraced = sys.gettrace()\nwhile not go:\n    time.sleep(0.01)\nfor k in range(5):\n    m = k\n"
    ns = run(code, script, monkeypatch, namespace=ns)
    assert ns["traced"] is None and ns["m"] == 4  # nothing traced while no breakpoint was set


def test_an_uncaught_exception_stops_post_mortem_in_the_frame_that_raised(monkeypatch):
    def script(nb, path):
        stopped = nb.next("stopped")
        assert (stopped["reason"], stopped["line"]) == ("exception", 3)
        assert stopped["text"] == "ZeroDivisionError: division by zero"
        assert nb.where() == [("g", 3), ("<module>", 4)]
        assert nb.value("q") == "0"
        nb.ask("next")  # nothing to step in a finished frame: it goes on
        nb.next("ended")

    run("def g(q):\n    return 1 / q\nr = g(0)\n", script, monkeypatch)


# ---------------------------------------------------------------------- the kernel's adapter
class KernelDebugger:
    """ipykernel's debugger as the adapter sees it: started, with the breakpoints it was given."""

    def __init__(self, breakpoint_list=None):
        self.is_started = True
        self.breakpoint_list = breakpoint_list or {}
        self.stopped_threads: set = set()
        self.asked: list[str] = []

    async def process_request(self, message):
        self.asked.append(message["command"])
        if message["command"] == "dumpCell":
            from ipykernel.compiler import get_file_name

            path = get_file_name(message["arguments"]["code"])
            return {"success": True, "command": "dumpCell", "body": {"sourcePath": path}}
        if message["command"] == "debugInfo":
            return {"success": True, "body": {"breakpoints": [], "stoppedThreads": []}}
        return {"success": True, "command": message["command"], "body": {}}


def ask(adapter, command, **arguments):
    import asyncio

    return asyncio.run(
        adapter.process_request({"seq": 1, "type": "request", "command": command, "arguments": arguments})
    )


def test_the_adapter_keeps_rank_cells_breakpoints_and_passes_plain_cells_on():
    from workbench.notebook.debugger.adapter import RankDebugger

    inner = KernelDebugger()
    adapter = RankDebugger(inner, emit=lambda event: None)
    rank_cell, plain = "%%distrain\nx = 1\ny = 2\n", "a = 1\nb = 2\n"
    path = ask(adapter, "dumpCell", code=rank_cell)["body"]["sourcePath"]
    reply = ask(adapter, "setBreakpoints", source={"path": path}, breakpoints=[{"line": 1}, {"line": 3}])
    assert [(b["line"], b["verified"]) for b in reply["body"]["breakpoints"]] == [(1, False), (3, True)]
    assert inner.asked == ["dumpCell"]  # the rank cell's breakpoints never reach debugpy
    assert adapter.breakpoints == {path: [{"line": 3, "condition": None}]}
    info = ask(adapter, "debugInfo")["body"]
    assert {"source": path, "breakpoints": [{"line": 3}]} in info["breakpoints"]
    plain_path = ask(adapter, "dumpCell", code=plain)["body"]["sourcePath"]
    ask(adapter, "setBreakpoints", source={"path": plain_path}, breakpoints=[{"line": 2}])
    assert inner.asked[-1] == "setBreakpoints" and plain_path not in adapter.breakpoints
    ask(adapter, "continue", threadId=1)  # nothing stopped on the ranks: the kernel's own thread
    assert inner.asked[-1] == "continue"


def test_a_frame_that_is_gone_answers_an_empty_list_jupyterlab_can_map_over():
    """JupyterLab maps over a scopes/variables/stackTrace reply's list without looking at
    ``success``: a failed one (a rank that went on, the kernel's own frame gone) carries an
    empty list, and the reason."""
    from workbench.notebook.debugger import cells
    from workbench.notebook.debugger.adapter import RankDebugger

    class Refusing(KernelDebugger):
        async def process_request(self, message):
            self.asked.append(message["command"])
            return {"success": False, "command": message["command"], "message": "Unable to find frame"}

    adapter = RankDebugger(Refusing(), emit=lambda event: None)
    # no cell runs on the ranks any more: rank 1's frame and variables are gone
    reply = ask(adapter, "scopes", frameId=cells.encode(1, 7))
    assert not reply["success"] and reply["body"] == {"scopes": []} and "no cell is running" in reply["message"]
    reply = ask(adapter, "variables", variablesReference=cells.encode(1, 3))
    assert not reply["success"] and reply["body"] == {"variables": []}
    assert ask(adapter, "stackTrace", threadId=cells.rank_thread(1))["body"]["stackFrames"] == []
    # the kernel's own debugger refusing a frame of its own
    reply = ask(adapter, "scopes", frameId=3)
    assert not reply["success"] and reply["body"] == {"scopes": []} and reply["message"] == "Unable to find frame"
    assert "body" not in ask(adapter, "evaluate", frameId=3, expression="x")  # other replies as they came


def test_breakpoints_the_kernel_got_before_the_adapter_was_installed_are_the_ranks():
    from ipykernel.compiler import get_file_name, get_tmp_directory

    from workbench.notebook.debugger.adapter import RankDebugger

    code = "%%distrain\nz = 3\n"
    path = get_file_name(code)
    made = not os.path.isdir(get_tmp_directory())
    os.makedirs(get_tmp_directory(), exist_ok=True)
    with open(path, "w") as fh:  # what the kernel's dumpCell wrote
        fh.write(code)
    try:
        adapter = RankDebugger(KernelDebugger({path: [{"line": 2}], "/some/file.py": [{"line": 1}]}), emit=print)
        assert adapter.breakpoints == {path: [{"line": 2, "condition": None}]}
    finally:
        os.unlink(path)
        if made:
            os.rmdir(get_tmp_directory())


class Hub:
    """The rank set's hub as the adapter uses it: a link address, and what it was asked to send."""

    link = debug_wire.LinkAddress("tcp://127.0.0.1:1", b"k", "sid")

    def __init__(self):
        self.sent = []
        self.listener = None

    def send(self, rank, message):
        self.sent.append((rank, message))
        return True

    def fail_pending(self, rank, text):
        pass


def stop_message(rank, line=4):
    return {
        "op": "stopped",
        "rank": rank,
        "stop": 1,
        "reason": "breakpoint",
        "path": "/p.py",
        "line": line,
        "cell": True,
    }


def test_ranks_stopping_together_are_one_stop_and_one_going_on_reshows_the_other(monkeypatch):
    from workbench.notebook.debugger import adapter as adapter_module

    monkeypatch.setattr(adapter_module, "SETTLE_S", 0.05)
    events = []
    adapter = adapter_module.RankDebugger(KernelDebugger(), emit=events.append)
    hub = Hub()
    spec = adapter.begin(hub, [0, 1], debug_wire.CellOrigin("/p.py", 1))
    assert spec.visual and spec.link is hub.link and hub.listener == adapter._on_rank
    hub.listener(stop_message(0))
    assert events == []  # rank 1 may stop too: wait a moment
    hub.listener(stop_message(1))  # every rank of the cell stopped: shown at once
    assert [(e["event"], e["body"]["threadId"], e["body"]["description"]) for e in events] == [
        ("stopped", cells.THREAD_BASE, "ranks 0-1 stopped at line 4")
    ]
    assert adapter.held()
    events.clear()
    hub.listener({"op": "resumed", "rank": 1, "stop": 1})
    assert [e["event"] for e in events] == ["continued"]
    deadline = time.monotonic() + 5
    while len(events) < 2 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert (events[1]["event"], events[1]["body"]["description"]) == ("stopped", "rank 0 stopped at line 4")
    adapter.end()  # the notebook stops following the cell: rank 0 is let go
    assert hub.sent == [(0, {"op": "request", "to": "debugger", "id": 0, "command": "release"})]
    assert events[-1]["event"] == "continued" and not adapter.held()


def test_a_client_with_threads_gets_each_rank_as_its_own_thread():
    from workbench.notebook.debugger.adapter import RankDebugger

    events = []
    adapter = RankDebugger(KernelDebugger(), emit=events.append)
    ask(adapter, "initialize", clientID="vscode")
    hub = Hub()
    adapter.begin(hub, [0, 1], None)
    hub.listener(stop_message(1, line=7))
    assert [(e["event"], e["body"]["threadId"]) for e in events] == [("stopped", cells.rank_thread(1))]
    hub.listener({"op": "resumed", "rank": 1, "stop": 1})
    assert (events[-1]["event"], events[-1]["body"]["threadId"]) == ("continued", cells.rank_thread(1))
    adapter.end()
