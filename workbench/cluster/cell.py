"""Running a cell on the ranks and showing what each rank produced, in rank order.

Output is grouped per rank and tagged ``[rank N]``; rich display data (HTML,
images, DataFrames) from a rank is re-published in the notebook. A cell that runs
longer than a few seconds starts streaming its output live, still tagged per rank,
so progress prints are seen while they happen (``stream=True`` from the start,
``stream=False`` never).
"""
from __future__ import annotations

import sys
import time

from .diagnosis import collect_stacks, main_frames, where
from .errors import CellTimeout, Interrupted, RankDied, RankFailure
from .health import death_message
from .ranges import format_ranks

STREAM_AFTER_S = 3.0


def run_cell(rankset, code: str, ranks=None, timeout: float | None = None, *, display: bool = True,
             stream: bool | None = None):
    """Run ``code`` on ``ranks``; show output; raise naming the rank on failure.

    Returns the :class:`RankCall`. No timeout unless one is given; on timeout the
    ranks keep running and the error holds each stuck rank's stack.
    """
    call = rankset.execute_async(code, ranks)
    printed = [[0, 0] for _ in call.ranks]  # chars of stdout/stderr already shown per rank
    start = time.monotonic()
    stream_after = {None: STREAM_AFTER_S, True: 0.0, False: float("inf")}[stream]
    done = False
    try:
        while True:
            budget = 0.25 if timeout is None else max(0.0, min(0.25, start + timeout - time.monotonic()))
            done = call.wait(budget)
            if done or call.deaths():
                break
            if display and time.monotonic() - start > stream_after:
                _stream(call, printed)
            if timeout is not None and time.monotonic() - start >= timeout:
                break
    except KeyboardInterrupt:
        rankset.interrupt(call.ranks)
        call.ar.wait(5)
        if display:
            show(call, printed)
        raise Interrupted(f"interrupted: sent SIGINT to ranks {format_ranks(call.ranks)}") from None
    if display:
        show(call, printed)
    deaths = [] if done and call.ar.successful() else call.deaths()
    if deaths:
        raise RankDied(death_message(deaths), deaths)
    if not done:
        stuck = call.pending()
        stacks = collect_stacks(rankset, stuck)
        raise CellTimeout(timeout_message(timeout, stuck, stacks), stacks)
    failures = call.failures()
    if failures:
        raise RankFailure(
            "the cell failed on rank(s) " + format_ranks(sorted(failures)) + " (tracebacks above)",
            failures,
        )
    return call


def timeout_message(timeout, stuck: list[int], stacks: dict[int, str]) -> str:
    lines = [f"the cell is still running after {timeout} s on ranks {format_ranks(stuck)} "
             "(left running; `%distrain stop` or Ctrl-C / interrupt to end it). Where each rank is:"]
    for rank, stack in stacks.items():
        lines.append(f"  [rank {rank}] {where(stack)}")
    for rank, stack in stacks.items():
        frames = main_frames(stack)
        if len(frames) > 1:
            lines.append(f"[rank {rank}] stack, innermost first:")
            lines.extend(f"[rank {rank}]   {f}" for f in frames)
    lines.append("(every thread's stack of each rank: the error's .diagnosis)")
    return "\n".join(lines)


def _tag(rank: int, text: str) -> str:
    return "".join(f"[rank {rank}] {line}\n" for line in text.splitlines())


def _stream(call, printed) -> None:
    """Print output that arrived since the last look, tagged per rank."""
    outs, errs = call.per_rank("stdout"), call.per_rank("stderr")
    for i, rank in enumerate(call.ranks):
        for j, (text, stream) in enumerate(((outs[i] or "", sys.stdout), (errs[i] or "", sys.stderr))):
            new = text[printed[i][j]:]
            cut = new.rfind("\n") + 1  # whole lines only while streaming
            if cut:
                stream.write(_tag(rank, new[:cut]))
                printed[i][j] += cut
    sys.stdout.flush()


def show(call, printed=None) -> None:
    """Show each rank's remaining stdout, stderr, rich outputs, result and error, in rank order."""
    printed = printed or [[0, 0] for _ in call.ranks]
    if call.ar.ready():
        # a rank's reply can overtake its last output (separate sockets): wait for the
        # output streams to be flushed too, so that nothing a rank printed is missed
        call.ar.wait_for_output(timeout=5)
    outs, errs = call.per_rank("stdout"), call.per_rank("stderr")
    displays, results = call.per_rank("outputs"), call.per_rank("execute_result")
    failures = call.failures()
    for i, rank in enumerate(call.ranks):
        out = (outs[i] or "")[printed[i][0]:]
        err = (errs[i] or "")[printed[i][1]:]
        if out:
            sys.stdout.write(_tag(rank, out))
            sys.stdout.flush()
        if err:
            sys.stderr.write(_tag(rank, err))
            sys.stderr.flush()
        for item in displays[i] or []:
            _publish(rank, item.get("data", {}), item.get("metadata", {}))
        if results[i]:
            _publish(rank, results[i].get("data", {}), results[i].get("metadata", {}), prefix="Out: ")
        if rank in failures:
            ename, evalue, tb = failures[rank]
            sys.stderr.write(_tag(rank, tb or f"{ename}: {evalue}"))
            sys.stderr.flush()


def _publish(rank: int, data: dict, metadata: dict, prefix: str = "") -> None:
    rich = {k: v for k, v in data.items() if k != "text/plain"}
    try:
        from IPython import get_ipython
        from IPython.display import publish_display_data

        in_ipython = get_ipython() is not None
    except ImportError:  # pragma: no cover
        in_ipython = False
    if rich and in_ipython:
        sys.stdout.write(f"[rank {rank}] {prefix}\n")
        sys.stdout.flush()
        publish_display_data(data=data, metadata=metadata)
    elif "text/plain" in data:
        sys.stdout.write(_tag(rank, prefix + data["text/plain"]))
        sys.stdout.flush()
