"""Runs a ``%%distrain`` cell on a rank, inside an ipyparallel apply request (``rpc.RunCell``).

The apply path is lighter on both ends than an execute request, and a plain-Python cell
skips IPython's input transforms; the notebook still sees the same IOPub messages and the
rank's shell keeps its history. Cells in IPython syntax (``%magic``, ``!cmd``, ``obj?``)
or with a top-level ``await`` go through the shell's full ``run_cell``."""

from __future__ import annotations

import array
import ast
import asyncio
import fcntl
import os
import re
import signal
import sys
import termios
import threading
from contextlib import contextmanager

# prompts that IPython strips from pasted code; such code may still parse as Python
_PASTED_PROMPT = re.compile(r"^\s*(>>>|\.\.\.|In \[\d+\]:)", re.M)


def run(code: str, debug=None, limit: int | None = None) -> int | None:
    """Run ``code`` in the rank's user namespace as an IPython cell would.

    ``limit``: the characters each of stdout and stderr passes on to the notebook (head and
    tail; the rest is in the rank's log: ``rank_log``); None passes everything on.
    Returns how many messages the rank's kernel made while the cell ran (its output,
    display data, ``Out:`` value and error among them; None where unknown): 0 tells
    the notebook that no output is on its way, so it need not wait for the output
    stream, which the reply can overtake. ``debug`` (a ``shared.debug_wire.CellDebug``):
    where the notebook's debug link is, which notebook cell this is, and whether the cell
    runs under JupyterLab's debugger (``cell_debugger``).
    """
    from IPython import get_ipython

    from . import rank_log

    shell = get_ipython()
    session = getattr(getattr(shell, "kernel", None), "session", None)
    before = getattr(session, "message_count", None)
    streams = [(stream, getattr(stream, "_buffers", None)) for stream in (sys.stdout, sys.stderr)]
    tree = plain_python(shell, code)
    rank_log.begin(limit)
    try:
        if debug is None:
            _run_either(shell, code, tree)
        else:
            _run_debuggable(shell, code, tree, debug)
    finally:
        # the cut line and tail of a stream that printed past its limit; its own write back
        # before the fd's marker below goes through it
        rank_log.end()
    # what C code or a child process wrote to fd 1/2 reaches the stream first: then it
    # belongs to this cell and the count includes it
    forwarded = [_fd_forwarded(stream) for stream, _ in streams]
    for stream, buffers in streams:
        if stream is not None and _written(stream, buffers):
            stream.flush()  # output still buffered is sent now, so that the count includes it
    if before is None or not all(forwarded):
        return None
    return session.message_count - before


def _run_either(shell, code: str, tree: ast.Module | None) -> None:
    if tree is None:
        with _awaits_on_own_loop(shell):
            shell.run_cell(code, store_history=True)
    elif tree.body:
        _run_plain(shell, code, tree)


def _run_debuggable(shell, code: str, tree: ast.Module | None, debug) -> None:
    """The cell with its debug link known (for ``breakpoint()``) and, with JupyterLab's
    debugger on, under the rank's debugger; the name its code is compiled under (the kernel's
    compiler names it from the code) is mapped to the notebook cell it came from."""
    from . import cell_debugger, debug_link

    rank = int(os.environ.get("RANK", "0"))  # set by the rank's bootstrap
    debug_link.configure(debug.link, rank)
    filename = shell.compile.get_code_name(code, code, shell.execution_count)
    cell_debugger.note_cell(filename, debug.origin)
    if not debug.visual:
        _run_either(shell, code, tree)
        return
    dbg = cell_debugger.debugger()
    with _stop_when_uncaught(shell, dbg):
        dbg.run(debug, filename, rank, lambda: _run_either(shell, code, tree))


@contextmanager
def _stop_when_uncaught(shell, dbg):
    """While JupyterLab's debugger asks to stop at uncaught exceptions: a cell that fails stops
    in its innermost frame before its traceback is shown (the shell shows it as it is raised)."""
    show = shell.showtraceback

    def stop_then_show(*args, **kwargs):
        if {"uncaught", "userUnhandled"} & set(dbg.exceptions) and dbg.active:
            kind, value, tb = sys.exc_info()
            if tb is not None and not isinstance(value, KeyboardInterrupt):
                dbg.post_mortem(tb, f"{kind.__name__}: {value}")
        return show(*args, **kwargs)

    shell.showtraceback = stop_then_show
    try:
        yield
    finally:
        if shell.showtraceback is stop_then_show:
            del shell.showtraceback  # the class's own again


def _written(stream, buffers) -> bool:
    """Whether ``stream`` may hold output that is not sent yet (``buffers``: its buffers
    when the cell started). An ipykernel stream that was written to, or whose buffers
    were taken for sending meanwhile, has a new or non-empty buffer map or a flush
    pending; asking it costs nothing, where a flush waits for the kernel's IO thread."""
    if buffers is None:  # not an ipykernel stream: flush to be sure
        return True
    return getattr(stream, "_buffers", None) is not buffers or bool(buffers) or getattr(stream, "_flush_pending", True)


def plain_python(shell, code: str) -> ast.Module | None:
    """The cell's syntax tree when IPython would run it unchanged; None otherwise."""
    if (
        shell.input_transformers_post
        or shell.ast_transformers
        or shell.ast_node_interactivity != "last_expr"
        or _PASTED_PROMPT.search(code)
    ):
        return None
    try:
        tree = ast.parse(code)
    except (SyntaxError, ValueError):  # IPython syntax, or an error the shell reports its way
        return None
    if any(isinstance(node, (ast.Await, ast.AsyncFor, ast.AsyncWith)) for node in ast.walk(tree)):
        return None  # top-level await: the shell's own rules apply
    return tree


def _run_plain(shell, code: str, tree: ast.Module) -> None:
    """IPython's ``run_cell_async`` for code that needs no transform: same history,
    events, display hook, error display and execution count."""
    from IPython.core.interactiveshell import ExecutionInfo, ExecutionResult

    info = ExecutionInfo(code, True, False, True, None, transformed_cell=code)
    result = ExecutionResult(info)
    count = result.execution_count = shell.execution_count
    shell.execution_count = count + 1
    shell.events.trigger("pre_execute")
    shell.events.trigger("pre_run_cell", info)
    shell.history_manager.store_inputs(count, code, code)
    with shell.builtin_trap:
        name = shell.compile.cache(code, count, raw_code=code)
        with shell.display_trap:
            shell.displayhook.exec_result = result
            body, last = tree.body[:-1], tree.body[-1]
            if isinstance(last, ast.Expr):  # the value of a last expression is shown (Out:)
                parts = [(ast.Module(body, []), "exec")] if body else []
                parts.append((ast.Interactive([last]), "single"))
            else:
                parts = [(tree, "exec")]
            raised = False
            for mod, mode in parts:
                raised = _sync(shell.run_code(shell.compile(mod, name, mode), result))
                if raised:
                    break
            shell.last_execution_succeeded = not raised
            shell.last_execution_result = result
            shell.displayhook.exec_result = None
    shell.history_manager.store_output(count)
    shell.events.trigger("post_execute")
    shell.events.trigger("post_run_cell", result)


def _sync(coro):
    """Drive a coroutine that never awaits (``run_code`` without ``async_``)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    coro.close()
    raise RuntimeError("a plain cell's code awaited")


@contextmanager
def _awaits_on_own_loop(shell):
    """Have IPython run a top-level ``await`` with :func:`run_awaiting` for one cell.

    Its default runner runs the cell on the running loop, which here is the kernel's own,
    busy running this apply request: ``run_until_complete`` fails at once. Other runners
    a user chose (``%autoawait trio``) are left alone.
    """
    from IPython.core.async_helpers import _asyncio_runner

    if shell.loop_runner is not _asyncio_runner:
        yield
        return
    shell.loop_runner = run_awaiting
    try:
        yield
    finally:
        if shell.loop_runner is run_awaiting:  # unless the cell chose one (%autoawait)
            shell.loop_runner = _asyncio_runner


class _OwnLoopRunner:
    """IPython's loop runner for a cell on a rank: runs the cell on IPython's own event loop
    (kept between cells, as in a terminal IPython) while the kernel's loop, which waits for
    this request to end anyway, is set aside.

    An interrupt while the cell waits cancels it (``CancelledError`` at its ``await``, as in
    a Jupyter kernel); while the cell's own code runs, it raises ``KeyboardInterrupt`` there,
    as in any cell. Either way the cell ends: it never resumes in a later cell.
    """

    def __call__(self, coro):
        from IPython.core.async_helpers import get_asyncio_loop

        kernel_loop = asyncio.events._get_running_loop()
        asyncio.events._set_running_loop(None)
        try:
            loop = get_asyncio_loop()
            task = loop.create_task(coro)

            def interrupt(signum, frame):
                if asyncio.current_task(loop) is task:
                    raise KeyboardInterrupt
                loop.call_soon_threadsafe(task.cancel)

            own_sigint = threading.current_thread() is threading.main_thread()
            previous = signal.signal(signal.SIGINT, interrupt) if own_sigint else None
            try:
                return loop.run_until_complete(task)
            finally:
                if own_sigint:
                    signal.signal(signal.SIGINT, previous)
                if not task.done():  # the loop itself was interrupted: the cell must not resume later
                    task.cancel()
                    loop.run_until_complete(asyncio.wait([task]))
        finally:
            asyncio.events._set_running_loop(kernel_loop)

    def __str__(self):  # what `%autoawait` says
        return "asyncio (the rank's own loop)"


run_awaiting = _OwnLoopRunner()


FD_SYNC_TIMEOUT_S = 2.0
_MARKER = b"\x1e"  # one byte, never split across reads; not NUL, which makes the rank log read as binary


def _fd_forwarded(stream) -> bool:
    """Wait until what was written to ``stream``'s file descriptor so far (C code, a child
    process: below Python) has been handed to ``stream``; False where that is not known.

    ipykernel points fd 1/2 at a pipe that a thread of its own reads into the stream, at
    its own pace: output written just before a cell ends could arrive after the cell's
    reply, and the notebook would have shown the cell without it. A marker byte written
    after it comes out of the pipe after it (a pipe keeps order), and the thread meets
    the marker only once all that came before it is in the stream.
    """
    watcher = getattr(stream, "watch_fd_thread", None)
    if getattr(stream, "_fid", None) is None or watcher is None:
        return True  # not captured at the fd level: nothing written below Python reaches it
    fd = stream._original_stdstream_fd
    try:
        if not _same_file(os.fstat(fd), os.fstat(stream._fid)):
            return True  # the cell pointed the fd elsewhere: what it writes there never reaches the stream
    except OSError:
        return True
    if not watcher.is_alive():
        return False
    if _pipe_drained(stream._fid, watcher):
        return True
    seen = getattr(stream, "_wb_marker_seen", None)
    if seen is None:
        seen = stream._wb_marker_seen = _watch_for_marker(stream, watcher)
    seen.clear()
    try:
        os.write(fd, _MARKER)
    except OSError:
        return False
    return seen.wait(FD_SYNC_TIMEOUT_S)


def _pipe_drained(fid: int, reader: threading.Thread) -> bool:
    """True when nothing written to the pipe ``fid`` so far is on its way to the stream: the
    pipe is empty and, after that, its reader sleeps in a read, which it calls again only once
    it has written what it read before. Asked of the kernel (two reads, no thread woken), it
    spares the marker's round trip through the reader thread on every quiet cell; where
    either answer is not known, False (the marker decides)."""
    try:
        pending = array.array("i", [0])
        fcntl.ioctl(fid, termios.FIONREAD, pending)
        if pending[0]:
            return False
        with open(f"/proc/self/task/{reader.native_id}/wchan", "rb") as f:
            where = f.read()
    except (OSError, ValueError):
        return False
    return where.endswith(b"pipe_read") or where == b"pipe_wait"  # kernels name the read's sleep so


def _same_file(a: os.stat_result, b: os.stat_result) -> bool:
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)  # a pipe's two ends are one inode


def _watch_for_marker(stream, watcher) -> threading.Event:
    """Wrap ``stream.write`` so that text from the pipe reader ``watcher`` drops the marker
    and says it met it (after writing what came before it)."""
    seen = threading.Event()
    write = stream.write
    marker = _MARKER.decode()

    def forward(text):
        if marker not in text or threading.current_thread() is not watcher:
            return write(text)
        text = text.replace(marker, "")
        written = write(text) if text else 0
        seen.set()
        return written

    stream.write = forward
    return seen


def lighten_kernel() -> None:
    """Take off the rank's kernel what it does per request that nobody reads or needs (at 64
    ranks on 2 cores the ranks' CPU is most of a cell's time: docs/scale.md). An ipykernel
    without the parts named is left as it is.

    - its log: ipyparallel's engine logger stands at DEBUG behind an INFO handler, so every
      request built four debug records to drop and wrote one "Handling ..." line; warnings
      and errors still reach the rank's log;
    - the output streams' flush, called four times after every request, waits on the kernel's
      IO thread twice even when nothing was written: with nothing pending it returns at once;
    - the "busy" status of an apply request, which neither the notebook's client nor the
      controller reads (the "idle" that marks a cell's output complete is kept);
    - the reply's way out: the shell stream queues it, arms the loop for writing, and sends it
      when the kernel flushes the stream right after; on the loop's own thread, with nothing
      queued before it, it is sent on the socket at once (a ROUTER: it never waits, queued or not).
    """
    import logging

    from IPython import get_ipython

    shell = get_ipython()
    kernel = getattr(shell, "kernel", None)
    if kernel is None:
        return
    log = getattr(kernel, "log", None)
    if isinstance(log, logging.Logger) and log.level < logging.WARNING:
        log.setLevel(logging.WARNING)
    for stream in (sys.stdout, sys.stderr):
        if all(hasattr(stream, a) for a in ("_buffers", "_flush_pending", "_subprocess_flush_pending", "echo")):
            stream.flush = _flush_if_pending(stream)
    publish = getattr(kernel, "_publish_status", None)
    if publish is not None and hasattr(kernel, "get_parent"):

        def publish_status(status, channel, parent=None):
            if status == "busy" and channel == "shell":
                header = (parent or kernel.get_parent(channel) or {}).get("header", {})
                if header.get("msg_type") == "apply_request":
                    return
            publish(status, channel, parent)

        kernel._publish_status = publish_status
    stream = getattr(kernel, "shell_stream", None)
    if stream is not None and not getattr(kernel, "_supports_kernel_subshells", False):
        _send_at_once(stream)


def _send_at_once(stream) -> None:
    import zmq

    queue, socket = getattr(stream, "_send_queue", None), getattr(stream, "socket", None)
    if queue is None or socket is None or socket.type != zmq.ROUTER or not hasattr(stream, "_update_handler"):
        return
    queued = stream.send_multipart
    loop_thread = threading.current_thread()  # the kernel's loop runs cells and requests alike

    def send_multipart(msg, flags=0, copy=True, track=False, callback=None, **kwargs):
        if (
            track
            or callback
            or kwargs
            or stream._send_callback
            or threading.current_thread() is not loop_thread
            or not queue.empty()
        ):
            return queued(msg, flags=flags, copy=copy, track=track, callback=callback, **kwargs)
        socket.send_multipart(msg, flags=flags, copy=copy)
        # a send can take the edge of the socket's descriptor that announced a request which
        # came meanwhile: look again, as the stream does after its own sends, or that request
        # waits until the next one wakes the loop
        stream._update_handler(stream._state)

    stream.send_multipart = send_multipart


def _flush_if_pending(stream):
    full = type(stream).flush.__get__(stream)

    def flush():
        # what another thread writes meanwhile schedules a flush of its own (flush_interval)
        if stream._buffers or stream._flush_pending or stream._subprocess_flush_pending or stream.echo is not None:
            full()

    return flush
