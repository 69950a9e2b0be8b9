"""Running a cell on the ranks and showing what each rank produced, in rank order.

Output is tagged ``[rank N]`` (past a few ranks, identical output once under
``[ranks 0-13,15]``: see ``grouping``); rich display data from a rank is re-published in the
notebook. Output is shown live as it comes, then regrouped when the cell ends (see ``live``;
where there is no kernel, a cell past ``STREAM_AFTER_S`` streams for good). A rank that fails
while others still run is shown at once (see ``stragglers``).
"""

from __future__ import annotations

import sys
import time

from ...shared import output_cut
from ...shared.errors import CellTimeout, Interrupted, RankDied, RankFailure
from ...shared.ranges import format_ranks
from .. import debugger
from . import culprit, debugging, grouping, stragglers
from .diagnosis import collect_stacks, main_frames, stack_lines, where
from .health import death_message
from .live import LIVE_POLL_S, LiveOutput, in_kernel, tag

STREAM_AFTER_S = 3.0  # where output cannot be regrouped (no kernel): live after this long
GRACE_S = stragglers.GRACE_S
# a failure seen while others still run is shown once no other has followed it for SETTLE_S
# (or BATCH_MAX_S after it), so that ranks failing alike are one grouped block, not a trickle
SETTLE_S = 0.2
BATCH_MAX_S = 0.6


def run_cell(
    rankset,
    code,
    ranks=None,
    timeout: float | None = None,
    *,
    display: bool = True,
    stream: bool | None = None,
    grace: float = GRACE_S,
    group: bool | None = None,
    output: int | None = output_cut.DEFAULT_LIMIT,
):
    """Run ``code`` (or a request of ``rpc`` that runs like a cell) on ``ranks``; show output;
    raise naming the rank on failure.

    Returns the :class:`RankCall`. No timeout unless one is given; on timeout the
    ranks keep running and the error holds each stuck rank's stack. When a rank
    fails while others still run, its traceback is shown at once and the others
    get ``grace`` seconds to finish before they are interrupted. ``group``: identical
    output of several ranks shown once under their ranks (None: past
    ``grouping.GROUP_PAST`` ranks). ``output``: about the most characters of printed output
    the cell shows, all ranks together (a head and a tail of each rank's; None: all of it);
    every line is in the ranks' log files (``%distrain logs``). ``stream``: where output cannot
    be regrouped (no kernel), live lines are printed for good after ``STREAM_AFTER_S`` (None),
    from the start (True) or never (False).
    """
    selected = rankset.select(ranks)
    call = rankset.execute_async(code, selected, debug=debugger.for_cell(rankset, selected, code), output=output)
    try:
        return _follow(rankset, call, timeout, display, stream, grace, group)
    finally:
        debugger.cell_ended()


def _follow(rankset, call, timeout, display, stream, grace, group):
    """Show ``call``'s output as it comes and wait for it (see :func:`run_cell`)."""
    group = grouping.resolve(group, len(call.ranks))
    regroup = display and in_kernel()
    live = LiveOutput(call, regroup=regroup)
    start = time.monotonic()
    default_after = 0.0 if regroup else STREAM_AFTER_S
    stream_after = {None: default_after, True: 0.0, False: float("inf")}[stream]
    poll = LIVE_POLL_S if stream_after < float("inf") else 0.25
    first: list[int] = []  # ranks whose failure was seen while others still ran, in order
    shown: list[int] = []  # of those, the ones whose traceback is shown already
    failed_at = batch_since = last_fresh = None
    noticed = False
    released = None
    done = False
    try:
        while True:
            budget = poll if timeout is None else max(0.0, min(poll, start + timeout - time.monotonic()))
            before = time.monotonic()
            done = call.wait(budget, poll=poll)
            if done or call.deaths():
                break
            held = 0.0
            for rank in debugging.waiting_sessions(rankset):
                if display and rank in call.ranks:  # breakpoint() on a rank: pdb here
                    since = time.monotonic()
                    live.poll()
                    debugging.attach(rankset, rank, [r for r in call.pending() if r != rank])
                    held += time.monotonic() - since
            if debugger.held():
                held = time.monotonic() - before
            if held:
                # time in a debugger (JupyterLab's, or pdb above) is no time of the cell's:
                # its timeout and a failed rank's grace wait while a rank is stopped in one
                start += held
                failed_at = failed_at + held if failed_at is not None else None
                batch_since = batch_since + held if batch_since is not None else None
            now = time.monotonic()
            if display and now - start > stream_after:
                live.poll()
            running = call.pending()
            fresh = [r for r in call.failures() if r not in first and r not in running]
            if fresh:
                first.extend(fresh)
                last_fresh = now
                batch_since = batch_since if batch_since is not None else now
                if failed_at is None:
                    failed_at = now
            if batch_since is not None and (now - last_fresh >= SETTLE_S or now - batch_since >= BATCH_MAX_S):
                # ranks that fail alike fail within moments of each other: shown together, grouped
                batch = [r for r in first if r not in shown]
                shown.extend(batch)
                batch_since = None
                if display:
                    _show_failures(call, live, batch, group=group)
                    if running and not noticed:
                        sys.stderr.write(stragglers.notice(first, running, grace) + "\n")
                        sys.stderr.flush()
                noticed = True
            if failed_at is not None and now - failed_at >= grace and call.pending():
                released = stragglers.release(rankset, call)
                done = call.ar.ready()
                break
            if timeout is not None and time.monotonic() - start >= timeout:
                break
    except KeyboardInterrupt:
        rankset.interrupt(call.ranks)
        call.ar.wait(5)
        if display:
            live.close()
            show(call, live.printed, skip=shown, group=group)
        raise Interrupted(f"interrupted: sent SIGINT to ranks {format_ranks(call.ranks)}") from None
    if display:
        live.close()
        show(call, live.printed, skip=shown, group=group)
    elif call.ar.ready():  # a rank's error is an output message, which the reply can overtake
        call.wait_for_output()
    deaths = [] if done and call.ar.successful() else call.deaths()
    if deaths:
        raise RankDied(death_message(deaths), deaths)
    failures = call.failures()
    if released is not None:
        ordered = {r: failures[r] for r in first if r in failures}
        ordered.update({r: f for r, f in failures.items() if r not in ordered})
        raise RankFailure(stragglers.failure_message(first, failures, released, grace), ordered)
    if not done:
        stuck = call.pending()
        stacks = collect_stacks(rankset, stuck)
        others = {r: "done with the cell" for r in call.ranks if r not in stuck}
        others.update({r: "not running this cell" for r in range(rankset.world_size) if r not in call.ranks})
        verdict = culprit.for_rankset(rankset, stacks, code=rankset.last_cell, others=others)
        raise CellTimeout(timeout_message(timeout, stuck, stacks, verdict.text), stacks, verdict)
    if failures:
        raise RankFailure(
            "the cell failed on rank(s) " + format_ranks(sorted(failures)) + " (tracebacks above)",
            failures,
        )
    return call


def _show_failures(call, live: LiveOutput, ranks: list[int], *, group: bool = False) -> None:
    """Show the tracebacks of ranks that failed while the cell still runs elsewhere."""
    failures = call.failures()
    for rank in ranks:
        live.flush_rank(call.ranks.index(rank))
    errors = [(rank, failures[rank]) for rank in ranks]
    batches = grouping.group_identical(errors, key=traceback_text) if group else [([r], f) for r, f in errors]
    for batch, failure in batches:
        sys.stderr.write(grouping.tag_ranks(batch, traceback_text(failure)))
    sys.stderr.flush()


def traceback_text(failure: tuple) -> str:
    ename, evalue, tb = failure
    return tb or f"{ename}: {evalue}"


def timeout_message(timeout, stuck: list[int], stacks: dict[int, str], conclusion: str = "") -> str:
    """The conclusion first (``culprit``), then where each stuck rank is and its frames."""
    lines = [conclusion] if conclusion else []
    lines.append(
        f"the cell is still running after {timeout} s on ranks {format_ranks(stuck)} "
        "(left running; `%distrain stop` or Ctrl-C / interrupt to end it). Where each rank is:"
    )
    for rank, stack in stacks.items():
        lines.append(f"  [rank {rank}] {where(stack)}")
    for rank, stack in stacks.items():
        frames = main_frames(stack)
        if len(frames) > 1:
            lines.extend(stack_lines(rank, frames))
    lines.append("(every thread's stack of each rank: the error's .diagnosis)")
    return "\n".join(lines)


def show(call, printed=None, skip=(), *, group: bool = False) -> None:
    """Show each rank's remaining stdout, stderr, rich outputs, result and error, in rank order.

    ``skip``: ranks whose error was already shown while the cell ran. ``group``: what
    several ranks produced alike is shown once under their ranks (``show_grouped``).
    """
    printed = printed or [[0, 0] for _ in call.ranks]
    if call.ar.ready():
        # a rank's reply can overtake its last output (separate sockets): wait for the
        # output streams to be flushed too, so that nothing a rank printed is missed
        if not call.wait_for_output():
            sys.stderr.write("(the ranks' output had not all arrived 30 s after the cell ended; showing what did)\n")
    outs, errs = call.per_rank("stdout"), call.per_rank("stderr")
    displays, results = call.per_rank("outputs"), call.per_rank("execute_result")
    failures = call.failures()
    if group:
        rest = [((outs[i] or "")[p[0] :], (errs[i] or "")[p[1] :]) for i, p in enumerate(printed)]
        show_grouped(call.ranks, rest, displays, results, failures, skip)
        return
    for i, rank in enumerate(call.ranks):
        out = (outs[i] or "")[printed[i][0] :]
        err = (errs[i] or "")[printed[i][1] :]
        if out:
            sys.stdout.write(tag(rank, out))
            sys.stdout.flush()
        if err:
            sys.stderr.write(tag(rank, err))
            sys.stderr.flush()
        for item in displays[i] or []:
            _publish(rank, item.get("data", {}), item.get("metadata", {}))
        if results[i]:
            _publish(rank, results[i].get("data", {}), results[i].get("metadata", {}), prefix="Out: ")
        if rank in failures and rank not in skip:
            ename, evalue, tb = failures[rank]
            sys.stderr.write(tag(rank, tb or f"{ename}: {evalue}"))
            sys.stderr.flush()


def show_grouped(ranks, rest, displays, results, failures, skip=()) -> None:
    """What the ranks produced, each distinct text once under the ranks that produced it:
    stdout, then stderr, rich outputs, results and tracebacks (the first failing rank's first)."""
    for j, stream in enumerate((sys.stdout, sys.stderr)):
        for group, text in grouping.group_identical((r, rest[i][j]) for i, r in enumerate(ranks) if rest[i][j]):
            stream.write(grouping.tag_ranks(group, output_cut.render(text, format_ranks(group))))
        stream.flush()
    items = [(r, item) for i, r in enumerate(ranks) for item in displays[i] or []]
    for group, item in grouping.group_identical(items, key=grouping.bundle_key):
        _publish(group, item.get("data", {}), item.get("metadata", {}))
    outs = [(r, results[i]) for i, r in enumerate(ranks) if results[i]]
    for group, item in grouping.group_identical(outs, key=grouping.bundle_key):
        _publish(group, item.get("data", {}), item.get("metadata", {}), prefix="Out: ")
    errors = [(r, failures[r]) for r in ranks if r in failures and r not in skip]
    for group, failure in grouping.group_identical(errors, key=traceback_text):
        sys.stderr.write(grouping.tag_ranks(group, traceback_text(failure)))
    sys.stderr.flush()


def _publish(rank: int | list[int], data: dict, metadata: dict, prefix: str = "") -> None:
    rich = {k: v for k, v in data.items() if k != "text/plain"}
    try:
        from IPython import get_ipython
        from IPython.display import publish_display_data

        in_ipython = get_ipython() is not None
    except ImportError:  # pragma: no cover
        in_ipython = False
    ranks = rank if isinstance(rank, list) else [rank]
    if rich and in_ipython:
        sys.stdout.write(f"[{grouping.label(ranks)}] {prefix}\n")
        sys.stdout.flush()
        publish_display_data(data=data, metadata=metadata)
    elif "text/plain" in data:
        sys.stdout.write(grouping.tag_ranks(ranks, prefix + data["text/plain"]))
        sys.stdout.flush()
