"""Runs a ``%%distrain`` cell on a rank, inside an ipyparallel apply request.

The notebook applies this (``rpc.RunCell``) rather than sending an execute request:
the apply path is lighter on both ends, and a cell in plain Python skips IPython's
input transforms, which only matter for IPython syntax. What the cell prints,
displays, returns (``Out:``) and raises reaches the notebook as the same IOPub
messages as from an execute request (stream, display_data, execute_result, error),
and the rank's shell keeps its history and execution count. Cells in IPython syntax
(``%magic``, ``!cmd``, ``obj?``) go through the shell's full ``run_cell``. The reply
says whether the cell published anything, so that a quiet cell's notebook side need
not wait for the output stream.
"""

from __future__ import annotations

import ast
import re
import select
import sys

# prompts that IPython strips from pasted code; such code may still parse as Python
_PASTED_PROMPT = re.compile(r"^\s*(>>>|\.\.\.|In \[\d+\]:)", re.M)


def run(code: str) -> int | None:
    """Run ``code`` in the rank's user namespace as an IPython cell would.

    Returns how many messages the rank's kernel made while the cell ran (its output,
    display data, ``Out:`` value and error among them; None where unknown): 0 tells
    the notebook that no output is on its way, so it need not wait for the output
    stream, which the reply can overtake.
    """
    from IPython import get_ipython

    shell = get_ipython()
    session = getattr(getattr(shell, "kernel", None), "session", None)
    before = getattr(session, "message_count", None)
    streams = [(stream, getattr(stream, "_buffers", None)) for stream in (sys.stdout, sys.stderr)]
    tree = plain_python(shell, code)
    if tree is None:
        shell.run_cell(code, store_history=True)
    elif tree.body:
        _run_plain(shell, code, tree)
    for stream, buffers in streams:
        if stream is not None and _written(stream, buffers):
            stream.flush()  # output still buffered is sent now, so that the count includes it
    if before is None or any(_fd_output_pending(stream) for stream, _ in streams):
        return None
    return session.message_count - before


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


def _fd_output_pending(stream) -> bool:
    """Whether output written at the file-descriptor level (C code, a subprocess) waits in
    the pipe that the kernel's reader thread forwards: it arrives after the reply."""
    fd = getattr(stream, "_fid", None)
    if fd is None:
        return False
    try:
        return bool(select.select([fd], [], [], 0)[0])
    except (OSError, ValueError):
        return True
