"""The kernel's debugger, extended to the ranks: JupyterLab's debug requests for rank cells.

ipykernel's debugger (debugpy in the kernel) is wrapped: requests about the ranks (breakpoints
in cells that run on them, rank threads, their frames and variables, steps) are answered here
over the rank set's debug hub; every other request goes to ipykernel's unchanged, so a plain
cell debugs in the kernel. What the user sees, what acts on which rank, and what of the
protocol is not carried: docs/cells.md.
"""

from __future__ import annotations

import asyncio
import itertools
import threading

from ...shared import debug_wire
from ...shared.ranges import format_ranks
from . import cells
from .hub import REQUEST_S, RankGone

SETTLE_S = 0.3  # ranks stopping within this of each other are shown as one stop
STEPS = ("continue", "next", "stepIn", "stepOut")


class _Run:
    """A cell running on the ranks under the debugger."""

    def __init__(self, hub, ranks: list[int]):
        self.hub = hub
        self.ranks = list(ranks)
        self.stopped: dict[int, dict] = {}  # rank -> its "stopped" message
        self.ended: set[int] = set()
        self.batch: set[int] = set()  # stopped since the last stop shown
        self.resuming: set[int] = set()  # asked to go on, not yet said they did
        self.reshow = False  # ranks still stopped after others went on: to be shown again
        self.announced: int | None = None  # the thread the shown stop was announced on
        self.focus: int | str = "all"
        self.sources: dict[str, int] = {}  # a path seen in a rank's frames -> a rank that has it
        self.timer: threading.Timer | None = None


class RankDebugger:
    """Wraps ipykernel's ``Debugger`` (``kernel.debugger``); see the module docstring."""

    def __init__(self, inner, emit, auto=lambda: False):
        self._inner = inner
        self._emit_raw = emit
        self._auto = auto  # whether plain cells run on the ranks now (auto mode)
        self._lock = threading.RLock()
        self._seq = itertools.count(1)
        self.merged = True  # one call stack for all ranks (JupyterLab); False: a thread per rank
        self.cells: dict[str, str] = {}  # path -> code of the cells dumped that run on the ranks
        self.breakpoints: dict[str, list[dict]] = {}  # rank cell path -> [{"line", "condition"}]
        self.files: dict[str, list[dict]] = {}  # file path -> its breakpoints (debugpy's and the ranks')
        self.exceptions: tuple[str, ...] = ()
        self.run: _Run | None = None
        self._adopt(getattr(inner, "breakpoint_list", None) or {})

    def _adopt(self, breakpoints: dict) -> None:
        """Breakpoints JupyterLab gave the kernel's debugger before this was installed (it sets
        them again as a kernel starts, before ``%load_ext workbench`` runs): those of cells that
        run on the ranks are the ranks' (the dumped cell's file says which)."""
        for path, points in list(breakpoints.items()):
            if not path.startswith(self._tmp_prefix()):
                continue
            try:
                with open(path, encoding="utf-8") as fh:
                    code = fh.read()
            except OSError:
                continue
            if cells.runs_on_ranks(code, self._auto()):
                self.cells[path] = code
                self.breakpoints[path] = [{"line": p["line"], "condition": None} for p in points if "line" in p]

    def __getattr__(self, name):  # everything ipykernel reaches on its debugger
        return getattr(self._inner, name)

    @property
    def visual(self) -> bool:
        """JupyterLab's debugger is on for this kernel."""
        return bool(getattr(self._inner, "is_started", False))

    # ------------------------------------------------------------------ cells on the ranks
    def begin(self, hub, ranks: list[int], origin: debug_wire.CellOrigin | None) -> debug_wire.CellDebug:
        """A cell is about to run on ``ranks``: what its request carries (main thread)."""
        with self._lock:
            self._finish_run()
            if not self.visual:
                return debug_wire.CellDebug(link=hub.link, origin=origin)
            self.run = _Run(hub, ranks)
            hub.listener = self._on_rank
            return debug_wire.CellDebug(
                link=hub.link,
                origin=origin,
                visual=True,
                breakpoints=self._rank_breakpoints(),
                exceptions=self.exceptions,
            )

    def end(self) -> None:
        """The cell ended (or the notebook stopped following it)."""
        with self._lock:
            self._finish_run()

    def held(self) -> bool:
        """Whether a rank of the running cell is stopped in the debugger (its clock should wait)."""
        run = self.run
        return run is not None and bool(run.stopped)

    def _finish_run(self) -> None:
        run, self.run = self.run, None
        if run is None:
            return
        if run.timer is not None:
            run.timer.cancel()
        for rank in list(run.stopped):  # nobody follows them any more: let them go
            run.hub.send(rank, {"op": "request", "to": "debugger", "id": 0, "command": "release"})
        if run.announced is not None:
            self._emit("continued", {"threadId": run.announced, "allThreadsContinued": True})

    def _rank_breakpoints(self) -> tuple[debug_wire.Breakpoint, ...]:
        out = []
        for table in (self.breakpoints, self.files):
            for path, points in table.items():
                out.extend(debug_wire.Breakpoint(path, p["line"], p.get("condition")) for p in points)
        return tuple(out)

    # ------------------------------------------------------------------ events from the ranks
    def _emit(self, event: str, body: dict) -> None:
        self._emit_raw({"seq": next(self._seq), "type": "event", "event": event, "body": body})

    def _on_rank(self, message: dict) -> None:
        """A rank's event (the hub's thread)."""
        with self._lock:
            run = self.run
            rank = message.get("rank")
            if run is None or rank not in run.ranks:
                return
            op = message.get("op")
            if op == "stopped":
                run.stopped[rank] = message
                run.batch.add(rank)
                path = message.get("path")
                if path and not message.get("cell"):
                    run.sources.setdefault(path, rank)
                if not self.merged:
                    self._emit("stopped", self._stop_body([rank], cells.rank_thread(rank)))
                    run.batch.clear()
                elif run.announced is not None:
                    # a stop the user has not seen joins those shown: show them all afresh
                    self._emit("continued", {"threadId": run.announced, "allThreadsContinued": False})
                    run.announced = None
                    self._schedule(run)
                else:
                    self._schedule(run)
            elif op == "resumed":
                run.stopped.pop(rank, None)
                run.batch.discard(rank)
                run.resuming.discard(rank)
                if not self.merged:
                    self._emit("continued", {"threadId": cells.rank_thread(rank), "allThreadsContinued": False})
                elif run.announced is not None:
                    self._emit("continued", {"threadId": run.announced, "allThreadsContinued": not run.stopped})
                    run.announced = None
                if self.merged and set(run.stopped) - run.resuming:
                    run.reshow = True  # those still stopped are shown again
                    self._schedule(run)
            elif op == "ended":
                run.ended.add(rank)
                run.stopped.pop(rank, None)
                run.batch.discard(rank)
                run.hub.fail_pending(rank, f"rank {rank} finished the cell")
                if self.merged and (run.batch or run.reshow) and run.announced is None:
                    self._schedule(run)

    def _schedule(self, run: _Run) -> None:
        """Show the stop now if every rank still in the cell is stopped, else in SETTLE_S."""
        if run.timer is not None:
            run.timer.cancel()
            run.timer = None
        waiting = [r for r in run.ranks if r not in run.ended and (r not in run.stopped or r in run.resuming)]
        if not waiting:
            self._announce(run)
            return
        run.timer = threading.Timer(SETTLE_S, self._announce_later, args=(run,))
        run.timer.daemon = True
        run.timer.start()

    def _announce_later(self, run: _Run) -> None:
        with self._lock:
            if self.run is run:
                self._announce(run)

    def _announce(self, run: _Run) -> None:
        if run.announced is not None:
            return
        batch = sorted(r for r in run.batch if r in run.stopped)
        run.batch.clear()
        reshow, run.reshow = run.reshow, False
        if not (batch or reshow) or not set(run.stopped) - run.resuming:
            return
        if isinstance(run.focus, int) and batch == [run.focus]:
            thread = cells.rank_thread(run.focus)
        else:
            run.focus = "all"
            thread = cells.THREAD_BASE
        run.announced = thread
        self._emit("stopped", self._stop_body(sorted(set(run.stopped) - run.resuming), thread))

    def _stop_body(self, ranks: list[int], thread: int) -> dict:
        run = self.run
        stops = [run.stopped[r] for r in ranks]
        reasons = [s.get("reason") for s in stops]
        reason = next((r for r in ("exception", "breakpoint", "pause") if r in reasons), "step")
        first = stops[0]
        where = f"line {first.get('line')}" if first.get("cell") else f"{first.get('path')}:{first.get('line')}"
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"
        body = {
            "reason": reason,
            "threadId": thread,
            "allThreadsStopped": False,
            "description": f"{label} stopped at {where}",
        }
        texts = [s.get("text") for s in stops if s.get("text")]
        if texts:
            body["text"] = texts[0]
        return body

    # ------------------------------------------------------------------ requests
    async def process_request(self, message: dict) -> dict:
        command = message.get("command")
        handler = self._handler(message)
        if handler is not None:
            try:
                return await handler(message)
            except (RankGone, RuntimeError, KeyError, ValueError) as exc:
                return _listed(message, _response(message, success=False, error=str(exc)))
        if command == "initialize":
            self.merged = (message.get("arguments") or {}).get("clientID", "jupyterlab") == "jupyterlab"
        if command == "disconnect":
            self._release_all()
        reply = await self._inner.process_request(message)
        return _listed(message, self._after(message, reply))

    def _handler(self, message: dict):
        command = message.get("command")
        args = message.get("arguments") or {}
        if command == "dumpCell" or not self.visual:
            return None
        if command == "setBreakpoints":
            path = (args.get("source") or {}).get("path", "")
            return self._set_cell_breakpoints if path in self.cells else None
        if command == "stackTrace" and cells.thread_rank(args.get("threadId")) is not None:
            return self._stack_trace
        if command in STEPS + ("pause",) and self._ranks_thread(args.get("threadId")):
            return self._step
        if command == "scopes" and self._frame(args.get("frameId")) is not None:
            return self._scopes
        if command == "variables" and cells.decode(args.get("variablesReference")) is not None:
            return self._variables
        if command in ("evaluate", "richInspectVariables") and self._frame(args.get("frameId")) is not None:
            return self._evaluate if command == "evaluate" else self._rich
        if command == "copyToGlobals" and self._frame(args.get("srcFrameId")) is not None:
            return self._copy_to_globals
        if command == "source" and self.run is not None:
            path = (args.get("source") or {}).get("path", "")
            return self._source if path in self.run.sources else None
        return None

    def _ranks_thread(self, thread_id) -> bool:
        """Whether a step names the ranks: a rank's thread, or (JupyterLab, whose continue names
        the thread it has just forgotten: 1) any thread not stopped in the kernel itself while
        ranks are stopped."""
        if cells.thread_rank(thread_id) is not None:
            return True
        kernel_stopped = getattr(self._inner, "stopped_threads", set())
        return self.merged and bool(self._stopped_ranks()) and thread_id not in kernel_stopped

    def _frame(self, frame_id):
        """(rank, the rank's frame id) of a rank frame, ("all", None) for the entry of all; else None."""
        if frame_id == cells.ALL_FRAME:
            return "all", None
        return cells.decode(frame_id)

    def _after(self, message: dict, reply: dict) -> dict:
        """What the kernel's own answer needs of the ranks' (dumped cells, files' breakpoints,
        the debugger's state, threads)."""
        command = message.get("command")
        args = message.get("arguments") or {}
        if command == "dumpCell" and reply.get("success"):
            code = args.get("code", "")
            path = (reply.get("body") or {}).get("sourcePath")
            if path and cells.runs_on_ranks(code, self._auto()):
                self.cells[path] = code
        elif command == "setBreakpoints" and reply.get("success"):
            path = (args.get("source") or {}).get("path", "")
            if not path.startswith(self._tmp_prefix()):  # a file: the ranks stop there too
                points = [{"line": b["line"]} for b in (reply.get("body") or {}).get("breakpoints", ()) if "line" in b]
                self.files[path] = points
                self._push_breakpoints()
        elif command == "setExceptionBreakpoints":
            self.exceptions = tuple(args.get("filters") or ())
            self._push_to_ranks("setExceptionBreakpoints", {"filters": list(self.exceptions)})
        elif command == "debugInfo" and reply.get("success"):
            body = reply.setdefault("body", {})
            body["breakpoints"] = [
                *body.get("breakpoints", []),
                *(
                    {"source": p, "breakpoints": [{"line": b["line"]} for b in bps]}
                    for p, bps in self.breakpoints.items()
                ),
            ]
            body["stoppedThreads"] = [*body.get("stoppedThreads", []), *self._stopped_threads()]
        elif command == "threads" and reply.get("success"):
            run = self.run
            if run is not None:
                threads = reply.setdefault("body", {}).setdefault("threads", [])
                threads.extend(
                    {"id": cells.rank_thread(r), "name": f"rank {r}"} for r in run.ranks if r not in run.ended
                )
        elif command == "disconnect":
            self.breakpoints.clear()
            self.files.clear()
            self.exceptions = ()
        return reply

    def _tmp_prefix(self) -> str:
        try:
            from ipykernel.compiler import get_tmp_directory

            return get_tmp_directory()
        except ImportError:  # pragma: no cover
            return "\0"

    def _stopped_threads(self) -> list[int]:
        run = self.run
        if run is None:
            return []
        if self.merged:
            return [run.announced] if run.announced is not None else []
        return [cells.rank_thread(r) for r in run.stopped]

    def _push_to_ranks(self, command: str, arguments: dict) -> None:
        run = self.run
        if run is not None:
            for rank in run.ranks:
                if rank not in run.ended:
                    run.hub.request(rank, command, arguments)  # answered or failed later; nobody waits

    def _push_breakpoints(self) -> None:
        points = [{"path": b.path, "line": b.line, "condition": b.condition} for b in self._rank_breakpoints()]
        self._push_to_ranks("setBreakpoints", {"breakpoints": points})

    def _release_all(self) -> None:
        with self._lock:
            self._push_to_ranks("release", {})
            run = self.run
            if run is not None:
                run.stopped.clear()
                run.batch.clear()
                run.announced = None

    async def _ask(self, rank: int, command: str, arguments: dict | None = None) -> dict:
        run = self.run
        if run is None:
            raise RankGone("no cell is running on the ranks")
        stop = run.stopped.get(rank, {}).get("stop")
        future = run.hub.request(rank, command, arguments, stop=stop)
        try:
            reply = await asyncio.wait_for(asyncio.wrap_future(future), REQUEST_S)
        except asyncio.TimeoutError:
            raise RankGone(f"rank {rank} did not answer {command!r} within {REQUEST_S:g} s") from None
        if not reply.get("success"):
            raise RuntimeError(reply.get("message") or f"rank {rank} refused {command!r}")
        return reply.get("body") or {}

    # ------------------------------------------------------------------ the ranks' requests
    async def _set_cell_breakpoints(self, message: dict) -> dict:
        args = message.get("arguments") or {}
        path = args["source"]["path"]
        code = self.cells[path]
        offset = cells.origin(path, code).offset
        wanted = {b["line"]: b.get("condition") for b in args.get("breakpoints", ()) if "line" in b}
        checked = cells.check_lines(code, offset, sorted(wanted))
        self.breakpoints[path] = [{"line": line, "condition": wanted[line]} for line, why in checked if why is None]
        if not self.breakpoints[path]:
            del self.breakpoints[path]
        self._push_breakpoints()
        out = []
        for line, why in checked:
            point = {"verified": why is None, "line": line, "source": {"path": path}}
            if why:
                point["message"] = why
            out.append(point)
        return _response(message, {"breakpoints": out})

    def _stopped_ranks(self) -> list[int]:
        run = self.run
        return sorted(set(run.stopped) - run.resuming) if run is not None else []

    async def _stack_trace(self, message: dict) -> dict:
        args = message.get("arguments") or {}
        which = cells.thread_rank(args.get("threadId"))
        stopped = self._stopped_ranks()
        if not self.merged:
            if which == "all" or which not in stopped:
                return _response(message, {"stackFrames": [], "totalFrames": 0})
            frames = await self._rank_frames(which, prefix=False)
            return _response(message, {"stackFrames": frames, "totalFrames": len(frames)})
        focus = self.run.focus if self.run is not None else "all"
        order = ([focus] if focus in stopped else []) + [r for r in stopped if r != focus]
        replies = await asyncio.gather(*(self._rank_frames(r, prefix=True) for r in order), return_exceptions=True)
        per_rank = {r: f for r, f in zip(order, replies) if not isinstance(f, BaseException) and f}
        ranks = [r for r in order if r in per_rank]
        every = []
        if len(ranks) > 1:  # first frame of the lowest rank, standing for them all
            label = f"[ranks {format_ranks(sorted(ranks))}] every stopped rank"
            every = [{**per_rank[min(ranks)][0], "id": cells.ALL_FRAME, "name": label}]
        if focus in per_rank:
            frames = per_rank[focus] + every + [f for r in ranks if r != focus for f in per_rank[r]]
        else:
            frames = every + [f for r in ranks for f in per_rank[r]]
        return _response(message, {"stackFrames": frames, "totalFrames": len(frames)})

    async def _rank_frames(self, rank: int, prefix: bool) -> list[dict]:
        body = await self._ask(rank, "stackTrace", {})
        out = []
        for frame in body.get("stackFrames", []):
            path = (frame.get("source") or {}).get("path", "")
            if path and path not in self.cells and self.run is not None:
                self.run.sources.setdefault(path, rank)
            name = f"[rank {rank}] {frame['name']}" if prefix else frame["name"]
            out.append({**frame, "id": cells.encode(rank, frame["id"]), "name": name})
        return out

    async def _scopes(self, message: dict) -> dict:
        args = message.get("arguments") or {}
        rank, frame = self._frame(args.get("frameId"))
        if self.run is not None:
            self.run.focus = rank
        if rank == "all":
            ranks = self._stopped_ranks()
            replies = await asyncio.gather(*(self._ask(r, "scopes", {"frameId": None}) for r in ranks))
            scopes = [
                {"name": f"rank {r}", "variablesReference": cells.encode(r, body["scopes"][0]["variablesReference"])}
                for r, body in zip(ranks, replies)
                if body.get("scopes")
            ]
            return _response(message, {"scopes": scopes})
        body = await self._ask(rank, "scopes", {"frameId": frame})
        scopes = [{**s, "variablesReference": cells.encode(rank, s["variablesReference"])} for s in body["scopes"]]
        return _response(message, {"scopes": scopes})

    async def _variables(self, message: dict) -> dict:
        args = message.get("arguments") or {}
        rank, ref = cells.decode(args["variablesReference"])
        body = await self._ask(rank, "variables", {"variablesReference": ref})
        out = [
            {**v, "variablesReference": cells.encode(rank, v["variablesReference"]) if v["variablesReference"] else 0}
            for v in body.get("variables", [])
        ]
        return _response(message, {"variables": out})

    async def _evaluate(self, message: dict) -> dict:
        args = dict(message.get("arguments") or {})
        rank, frame = self._frame(args.get("frameId"))
        if rank == "all":
            ranks = self._stopped_ranks()
            args["frameId"] = None
            replies = await asyncio.gather(*(self._ask(r, "evaluate", args) for r in ranks), return_exceptions=True)
            lines = [
                f"[rank {r}] {reply['result'] if isinstance(reply, dict) else f'{type(reply).__name__}: {reply}'}"
                for r, reply in zip(ranks, replies)
            ]
            return _response(message, {"result": "\n".join(lines), "variablesReference": 0})
        args["frameId"] = frame
        body = await self._ask(rank, "evaluate", args)
        ref = body.get("variablesReference") or 0
        return _response(message, {**body, "variablesReference": cells.encode(rank, ref) if ref else 0})

    async def _rich(self, message: dict) -> dict:
        args = dict(message.get("arguments") or {})
        rank, frame = self._frame(args.get("frameId"))
        if rank == "all":  # one value to render: the lowest stopped rank's
            stopped = self._stopped_ranks()
            if not stopped:
                raise RankGone("no rank is stopped")
            rank, frame = stopped[0], None
        args["frameId"] = frame
        return _response(message, await self._ask(rank, "richInspectVariables", args))

    async def _copy_to_globals(self, message: dict) -> dict:
        args = dict(message.get("arguments") or {})
        rank, frame = self._frame(args.get("srcFrameId"))
        ranks = self._stopped_ranks() if rank == "all" else [rank]
        for r in ranks:  # from the entry of all ranks: on every stopped rank
            await self._ask(r, "copyToGlobals", {**args, "srcFrameId": frame})
        return _response(message, {})

    async def _source(self, message: dict) -> dict:
        args = message.get("arguments") or {}
        rank = self.run.sources[args["source"]["path"]]
        return _response(message, await self._ask(rank, "source", args))

    async def _step(self, message: dict) -> dict:
        args = message.get("arguments") or {}
        command = message["command"]
        which = cells.thread_rank(args.get("threadId"))
        run = self.run
        if run is None:
            raise RankGone("no cell is running on the ranks")
        if self.merged:
            which = run.focus
        if command == "pause":
            targets = [r for r in run.ranks if r not in run.ended and r not in run.stopped]
            targets = targets if which == "all" else [r for r in targets if r == which]
        else:
            stopped = self._stopped_ranks()
            targets = stopped if which == "all" else [r for r in stopped if r == which]
            if not targets:
                raise RankGone("no rank is stopped" if which == "all" else f"rank {which} is not stopped")
        if command != "pause":
            with self._lock:
                run.resuming.update(targets)
        await asyncio.gather(*(self._ask(r, command, {}) for r in targets))
        every = command != "pause" and set(targets) >= set(self._stopped_ranks())
        return _response(message, {"allThreadsContinued": every})


# what JupyterLab reads from these replies without looking at ``success`` first
LISTS = {"scopes": "scopes", "variables": "variables", "stackTrace": "stackFrames"}


def _listed(message: dict, reply: dict) -> dict:
    """A failed ``scopes``/``variables``/``stackTrace`` reply (a rank that went on, a frame that
    is gone) with an empty list in its body: JupyterLab maps over it, and throws on none."""
    key = LISTS.get(message.get("command"))
    if key is not None and not reply.get("success"):
        body = reply.get("body")
        reply["body"] = body = body if isinstance(body, dict) else {}
        body.setdefault(key, [])
    return reply


def _response(message: dict, body: dict | None = None, *, success: bool = True, error: str | None = None) -> dict:
    reply = {
        "type": "response",
        "request_seq": message.get("seq"),
        "success": success,
        "command": message.get("command"),
        "body": body or {},
    }
    if error is not None:
        reply["message"] = error
    return reply
