"""JupyterLab's debugger on a rank: a ``bdb`` debugger for the thread that runs the cell.

It stops at the notebook's breakpoints (a cell's lines mapped to the code the rank compiled,
:func:`note_cell`), at ``breakpoint()``, at a pause and at an uncaught exception; stopped,
the cell's thread answers the notebook's requests itself, which reach it from the debug
link's thread. Frames are reported in the notebook's terms (a cell's path and line). How the
pieces fit: docs/cells.md ("How it works").
"""

from __future__ import annotations

import bdb
import collections
import linecache
import os
import queue
import signal
import sys
import sysconfig
import threading

from ..shared import debug_wire
from . import debug_link, debug_values

WAKE = signal.SIGUSR2  # the link's thread wakes the cell's thread (SIGUSR1 is the stack dump's)
WAIT_S = 1.0  # a stopped rank looks up this often whether it was released (it is woken at once by a request)
_ORIGIN_MAX = 2000

# compiled name of a cell's code on this rank -> the notebook cell it came from, and back
_ORIGINS: collections.OrderedDict[str, debug_wire.CellOrigin] = collections.OrderedDict()
_FILES: dict[str, str] = {}
_DEBUGGER: CellDebugger | None = None


def note_cell(filename: str, origin: debug_wire.CellOrigin | None) -> None:
    """Remember that the code compiled as ``filename`` is the notebook cell ``origin``: its
    breakpoints and frames are mapped by this, also in later cells that call its functions."""
    if origin is None:
        return
    _ORIGINS[filename] = origin
    _ORIGINS.move_to_end(filename)
    _FILES[origin.path] = filename
    while len(_ORIGINS) > _ORIGIN_MAX:
        old, gone = _ORIGINS.popitem(last=False)
        if _FILES.get(gone.path) == old:
            del _FILES[gone.path]


def where(filename: str, line: int) -> tuple[str, int]:
    """A rank's (file, line) in the notebook's terms: a cell's path and line where it is one."""
    origin = _ORIGINS.get(filename)
    if origin is None:
        return filename, line
    return origin.path, line + origin.offset


def _library_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    roots = {paths.get(k) for k in ("stdlib", "platstdlib", "purelib", "platlib")}
    roots.add(os.path.dirname(os.path.dirname(__file__)))  # the workbench itself
    return tuple(sorted(os.path.realpath(r) + os.sep for r in roots if r))


_LIBRARIES = _library_roots()
_MINE: dict[str, bool] = {}


def is_mine(filename: str) -> bool:
    """Whether a step may stop in ``filename``: a cell, or a file not of Python or its libraries."""
    mine = _MINE.get(filename)
    if mine is None:
        if filename in _ORIGINS or filename.startswith("<"):
            mine = filename in _ORIGINS
        else:
            mine = not os.path.realpath(filename).startswith(_LIBRARIES)
        _MINE[filename] = mine
    return mine


class _Stop:
    """One stop: its number, its frames (innermost first) and the references made while in it."""

    def __init__(self, seq: int, frames: list, reason: str):
        self.seq = seq
        self.frames = frames
        self.reason = reason
        self.refs = debug_values.Refs()

    def frame(self, frame_id) -> object:
        index = len(self.frames) - 1 - int(frame_id)  # ids count from the outermost frame
        if not 0 <= index < len(self.frames):
            raise KeyError(f"no frame {frame_id} at this stop")
        return self.frames[index]


class CellDebugger(bdb.Bdb):
    """The rank's debugger (one per rank process); see the module docstring."""

    def __init__(self) -> None:
        super().__init__()
        self._dispatch = self.trace_dispatch  # one bound method, handed back on every event
        self.rank = 0
        self.link: debug_link.Link | None = None
        self.active = False
        self.thread: int | None = None
        self.cell_file: str | None = None
        self.exceptions: tuple[str, ...] = ()
        self._breaks: dict[str, dict[int, str | None]] = {}
        self._commands: queue.Queue = queue.Queue()
        self._stopped: _Stop | None = None
        self._stops = 0
        self._pause = False
        self._reason: str | None = None
        self._released = False
        self._stepping = False  # the last resume was a step (next, stepIn), not continue or stepOut
        self._signalled = False  # the cell runs on the main thread: it can be woken by a signal
        self._waking = threading.Lock()  # a wake-up and the end of the cell's handler, one at a time

    # ------------------------------------------------------------------ a cell
    def run(self, debug: debug_wire.CellDebug, filename: str, rank: int, body):
        """Run ``body()`` (the cell) under this debugger; the link is open meanwhile."""
        self.rank = rank
        self.cell_file = filename
        self.exceptions = tuple(debug.exceptions)
        self.set_breakpoints(debug.breakpoints)
        self._released = False
        self._pause = False
        self._commands = queue.Queue()
        self.link = debug_link.open_for("debugger", self._on_message)
        self.quitting = False
        self.botframe = sys._getframe()
        self._set_continue()
        self.thread = threading.get_ident()
        self.active = True
        self.link.send({"op": "started"})
        # nothing traced while no breakpoint is set: a pause or a breakpoint set meanwhile
        # reaches this thread as a signal (_on_signal), which starts tracing where it is
        main = self._signalled = threading.current_thread() is threading.main_thread()
        previous = signal.signal(WAKE, self._on_signal) if main else None
        if self._breaks:
            sys.settrace(self.trace_dispatch)
        try:
            return body()
        finally:
            sys.settrace(None)
            with self._waking:  # no signal is sent once the handler is not ours any more
                self.active = False
                if main:
                    signal.signal(WAKE, previous)
            self.botframe = None
            link, self.link = self.link, None
            link.send({"op": "ended"})
            debug_link.close_for("debugger", link)

    def set_breakpoints(self, breakpoints) -> None:
        """Replace the breakpoints: cells' lines mapped to their compiled code on this rank
        (while a cell runs, from the link's thread: the cell's thread is told to look again)."""
        table: dict[str, dict[int, str | None]] = {}
        for bp in breakpoints:
            filename = _FILES.get(bp.path)
            if filename is not None:
                line = bp.line - _ORIGINS[filename].offset
            else:
                filename, line = bp.path, bp.line
            if line >= 1:
                table.setdefault(filename, {})[line] = bp.condition or None
        self._breaks = table  # one assignment: the traced thread sees the old table or the new
        if self.active and self._stopped is None and table:
            self._wake()

    # ------------------------------------------------------------------ bdb
    def _set_continue(self) -> None:
        # bdb's own set_continue stops tracing when no breakpoint is left; here a pause, a
        # breakpoint added later and breakpoint() must still stop the cell
        self._set_stopinfo(self.botframe, None, -1)

    def trace_dispatch(self, frame, event, arg):
        # running on (not stepping), only a breakpoint's line can stop: every other event is
        # answered here, without bdb's dispatch (what tracing costs: docs/cells.md)
        if self.stoplineno == -1 and not self.quitting:
            lines = self._breaks.get(frame.f_code.co_filename)
            if event == "call":
                return self._dispatch if lines else None
            if event == "line" and (not lines or frame.f_lineno not in lines):
                return self._dispatch
            if event in ("return", "exception") and self.returnframe is None:
                return self._dispatch
        return super().trace_dispatch(frame, event, arg)

    def break_anywhere(self, frame) -> bool:
        return frame.f_code.co_filename in self._breaks

    def break_here(self, frame) -> bool:
        lines = self._breaks.get(frame.f_code.co_filename)
        if not lines or frame.f_lineno not in lines:
            return False
        condition = lines[frame.f_lineno]
        if condition:
            try:
                if not eval(condition, frame.f_globals, frame.f_locals):
                    return False
            except Exception:  # as pdb: a condition that fails stops, so that it is seen
                pass
        self._reason = "breakpoint"
        return True

    def stop_here(self, frame) -> bool:
        return super().stop_here(frame) and is_mine(frame.f_code.co_filename) and self._in_cell(frame)

    def _in_cell(self, frame) -> bool:
        while frame is not None and frame is not self.botframe:
            if frame.f_code.co_filename == self.cell_file:
                return True
            frame = frame.f_back
        return False

    def user_call(self, frame, argument_list) -> None:
        pass  # a step into a function stops at its first line, not at the call

    def user_line(self, frame) -> None:
        reason, self._reason = self._reason or "step", None
        self._interact(frame, reason)

    def user_return(self, frame, return_value) -> None:
        # a step out of a frame stops at the caller's next line, never at the return itself
        caller = frame.f_back
        if caller is not None and caller is not self.botframe and self._in_cell(caller):
            caller.f_trace = self.trace_dispatch
            self._set_stopinfo(caller, None)
        elif self._stepping and frame.f_code.co_filename == self.cell_file:
            # the shell runs a cell in parts (its last expression on its own, to show its
            # value): a step past one part stops at the next part's first line
            self._set_stopinfo(None, None)
        else:
            self._set_continue()

    def user_exception(self, frame, exc_info) -> None:
        pass  # uncaught exceptions stop once the cell has failed (cell_runner), not where raised

    def set_trace_here(self, frame, reason: str = "breakpoint") -> None:
        """``breakpoint()`` in the cell (or a pause): stop at the next line of the cell's code."""
        self._trace_from(frame)
        self._reason = reason
        self._stepping = True
        self.set_step()

    def _trace_from(self, frame) -> None:
        """Trace this thread from here on, the frames it is in included."""
        sys.settrace(self.trace_dispatch)
        while frame is not None and frame is not self.botframe:
            frame.f_trace = self.trace_dispatch
            frame = frame.f_back

    def _wake(self) -> None:
        """Have the cell's thread run :meth:`_on_signal` (from the link's thread); only the
        main thread runs signal handlers: a cell on another thread is not paused."""
        with self._waking:
            if not (self._signalled and self.active):
                return
            try:
                signal.pthread_kill(self.thread, WAKE)
            except (OSError, ValueError, TypeError):  # the thread is gone
                pass

    def _on_signal(self, signum, frame) -> None:
        """On the cell's thread, where it is now: stop there (a pause), or trace from there
        (a breakpoint was set)."""
        if not self.active or self._stopped is not None or frame is None:
            return
        if self._pause:
            self._pause = False
            self.set_trace_here(frame, "pause")
        elif self._breaks:
            self._trace_from(frame)

    def post_mortem(self, tb, error: str) -> None:
        """The cell failed with traceback ``tb``: stop in its innermost frame of the cell's until released."""
        frames = []
        while tb is not None:
            frames.append(tb.tb_frame)
            tb = tb.tb_next
        inner = [f for f in frames if self._in_cell(f)]
        mine = [f for f in inner if is_mine(f.f_code.co_filename)]
        if not inner:
            return
        trace = sys.gettrace()
        sys.settrace(None)  # what the user evaluates meanwhile must not stop again
        try:
            self._interact((mine or inner)[-1], "exception", text=error, post_mortem=True)
        finally:
            sys.settrace(trace)

    # ------------------------------------------------------------------ stopped
    def _frames(self, frame) -> list:
        """The user's frames from ``frame`` out to the cell's own (innermost first)."""
        out = []
        while frame is not None and frame is not self.botframe:
            out.append(frame)
            if frame.f_code.co_filename == self.cell_file and frame.f_code.co_name == "<module>":
                break
            frame = frame.f_back
        return out

    def _interact(self, frame, reason: str, *, text: str = "", post_mortem: bool = False) -> None:
        if self._released or self.link is None:
            self._set_continue()
            return
        frames = self._frames(frame)
        for f in frames:  # a step out of the stopped frame lands in a traced caller
            f.f_trace = self.trace_dispatch
        self._stops += 1
        stop = _Stop(self._stops, frames, reason)
        path, line = where(frame.f_code.co_filename, frame.f_lineno)
        self._stopped = stop
        cell = frame.f_code.co_filename in _ORIGINS
        self.link.send(
            {
                "op": "stopped",
                "stop": stop.seq,
                "reason": reason,
                "text": text,
                "path": path,
                "line": line,
                "cell": cell,
            }
        )
        resume = "continue"
        try:
            while True:
                try:
                    request = self._commands.get(timeout=WAIT_S)
                except queue.Empty:
                    if self._released:
                        break
                    continue
                if request is None:  # released: the debugger was switched off
                    break
                resume = self._answer(stop, request)
                if resume:
                    break
        finally:
            self._stopped = None
            self._drain()
            if self.link is not None:
                self.link.send({"op": "resumed", "stop": stop.seq})
        if post_mortem or self._released:
            return
        top = frames[0]
        self._stepping = resume in ("next", "stepIn")
        if resume == "next":
            self.set_next(top)
        elif resume == "stepIn":
            self.set_step()
        elif resume == "stepOut":
            self.set_return(top)
        else:
            self._set_continue()

    def _drain(self) -> None:
        while True:
            try:
                request = self._commands.get_nowait()
            except queue.Empty:
                return
            if request is not None and self.link is not None:
                self.link.send(debug_link.reply(request, message=f"rank {self.rank} is running again"))

    def _answer(self, stop: _Stop, request: dict) -> str | None:
        """Answer one request while stopped; the name of the resume it asks for, if any."""
        command = request.get("command")
        args = request.get("arguments") or {}
        if request.get("stop") not in (None, stop.seq):
            self.link.send(debug_link.reply(request, message=f"rank {self.rank} moved on since"))
            return None
        if command in ("continue", "next", "stepIn", "stepOut"):
            self.link.send(debug_link.reply(request, {"allThreadsContinued": False}))
            return command
        handler = _HANDLERS.get(command)
        if handler is None:
            self.link.send(debug_link.reply(request, message=f"{command!r} is not carried to the ranks"))
            return None
        try:
            body = handler(self, stop, args)
        except Exception as exc:
            self.link.send(debug_link.reply(request, message=f"{type(exc).__name__}: {exc}"))
        else:
            self.link.send(debug_link.reply(request, body))
        return None

    # ------------------------------------------------------------------ the link's thread
    def _on_message(self, message: dict) -> None:
        if message.get("op") != "request":
            return
        command = message.get("command")
        args = message.get("arguments") or {}
        if command == "setBreakpoints":
            self.set_breakpoints(debug_wire.Breakpoint(**bp) for bp in args.get("breakpoints", ()))
            self.link.send(debug_link.reply(message, {}))
        elif command == "setExceptionBreakpoints":
            self.exceptions = tuple(args.get("filters", ()))
            self.link.send(debug_link.reply(message, {}))
        elif command == "pause":
            self._request_pause()
            self.link.send(debug_link.reply(message, {}))
        elif command == "release":  # the debugger was switched off: run to the end, stop no more
            self._released = True
            self._breaks = {}
            self._commands.put(None)
            self.link.send(debug_link.reply(message, {}))
        elif command == "source":
            self.link.send(debug_link.reply(message, _source(self, None, args)))
        elif self._stopped is not None:
            self._commands.put(message)
        else:
            self.link.send(debug_link.reply(message, message=f"rank {self.rank} is running (not stopped)"))

    def _request_pause(self) -> None:
        if self._stopped is not None or not self.active:
            return
        self._pause = True
        self._wake()


# ---------------------------------------------------------------------- requests while stopped
def _stack_trace(dbg: CellDebugger, stop: _Stop, args: dict) -> dict:
    out = []
    for i, frame in enumerate(stop.frames):
        path, line = where(frame.f_code.co_filename, frame.f_lineno)
        out.append(
            {
                "id": len(stop.frames) - 1 - i,
                "name": frame.f_code.co_name,
                "line": line,
                "column": 1,
                "source": {"path": path, "name": os.path.basename(path)},
            }
        )
    return {"stackFrames": out, "totalFrames": len(out), "reason": stop.reason}


def _frame_of(stop: _Stop, args: dict, key: str = "frameId"):
    """The frame a request names; the innermost when it names none."""
    return stop.frames[0] if args.get(key) is None else stop.frame(args[key])


def _scopes(dbg: CellDebugger, stop: _Stop, args: dict) -> dict:
    frame = _frame_of(stop, args)
    scopes = [{"name": "Locals", "variablesReference": stop.refs.add("scope", frame.f_locals), "expensive": False}]
    if frame.f_globals is not frame.f_locals:
        scopes.append(
            {"name": "Globals", "variablesReference": stop.refs.add("scope", frame.f_globals), "expensive": False}
        )
    return {"scopes": scopes}


def _variables(dbg: CellDebugger, stop: _Stop, args: dict) -> dict:
    kind, obj = stop.refs.get(int(args["variablesReference"]))
    return {"variables": debug_values.child_variables(kind, obj, stop.refs)}


def _evaluate(dbg: CellDebugger, stop: _Stop, args: dict) -> dict:
    frame = _frame_of(stop, args)
    expression = args.get("expression", "")
    try:
        code = compile(expression, "<debugger>", "eval")
    except SyntaxError:  # a statement (x = 1, import os): run it; it shows no value
        exec(compile(expression, "<debugger>", "exec"), frame.f_globals, frame.f_locals)
        return {"result": "", "variablesReference": 0}
    value = eval(code, frame.f_globals, frame.f_locals)
    shown = debug_values.variable(expression, value, stop.refs)
    return {"result": shown["value"], "type": shown["type"], "variablesReference": shown["variablesReference"]}


def _rich(dbg: CellDebugger, stop: _Stop, args: dict) -> dict:
    from IPython import get_ipython

    frame = _frame_of(stop, args)
    name = args.get("variableName", "")
    if not name.isidentifier():
        return {"data": {}, "metadata": {}}
    value = eval(name, frame.f_globals, frame.f_locals)
    data, metadata = get_ipython().display_formatter.format(value)
    return {"data": data, "metadata": {k: v for k, v in metadata.items() if k in data}}


def _copy_to_globals(dbg: CellDebugger, stop: _Stop, args: dict) -> dict:
    frame = _frame_of(stop, args, "srcFrameId")
    src, dst = args["srcVariableName"], args["dstVariableName"]
    if not (src.isidentifier() and dst.isidentifier()):
        raise ValueError("srcVariableName and dstVariableName must be identifiers")
    frame.f_globals[dst] = eval(src, frame.f_globals, frame.f_locals)
    return {}


def _source(dbg: CellDebugger, stop: _Stop | None, args: dict) -> dict:
    path = (args.get("source") or {}).get("path") or ""
    filename = _FILES.get(path, path)
    lines = linecache.getlines(filename)
    if not lines:
        raise FileNotFoundError(f"rank {dbg.rank} has no source for {path}")
    origin = _ORIGINS.get(filename)
    above = "\n" * origin.offset if origin is not None else ""  # a cell's code, at the cell's lines
    return {"content": above + "".join(lines)}


_HANDLERS = {
    "stackTrace": _stack_trace,
    "scopes": _scopes,
    "variables": _variables,
    "evaluate": _evaluate,
    "richInspectVariables": _rich,
    "copyToGlobals": _copy_to_globals,
    "source": _source,
}


def debugger() -> CellDebugger:
    global _DEBUGGER
    if _DEBUGGER is None:
        _DEBUGGER = CellDebugger()
    return _DEBUGGER


def active_here() -> CellDebugger | None:
    """The debugger tracing this thread's cell, if any (``breakpoint()`` stops in it then)."""
    dbg = _DEBUGGER
    if dbg is not None and dbg.active and dbg.thread == threading.get_ident() and not dbg._released:
        return dbg
    return None
