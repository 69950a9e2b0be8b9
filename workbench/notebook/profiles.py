"""Notebook-side: ``%distrain profile --steps N``: torch.profiler on the ranks for N steps of
their trainer, the traces gathered into one folder, a summary and a merged timeline.

The ranks do the profiling (``workbench.engine.profiling``); this arms them, waits, fetches
each rank's Chrome/Perfetto trace (``rank{r}.trace.json``, openable in ui.perfetto.dev or
chrome://tracing) and reads them (``workbench.notebook.dashboard.profile_figure``).
"""

from __future__ import annotations

import os
import pathlib
import time
from dataclasses import dataclass

from ..engine import rpc
from . import api

__all__ = ["Profile", "profile", "profile_cell"]


@dataclass(frozen=True)
class Profile:
    """What a profile of the ranks produced: trace files, per-rank summary, top ops, figure."""

    folder: str
    files: dict  # rank -> path of its trace
    summary: object  # pandas DataFrame, one row per rank
    top_ops: object  # pandas DataFrame
    figure: object  # plotly Figure

    def _ipython_display_(self):
        from IPython.display import HTML, display

        files = "".join(f"<li>rank {r}: <code>{p}</code></li>" for r, p in sorted(self.files.items()))
        display(HTML(f"<b>traces</b> (open in ui.perfetto.dev or chrome://tracing):<ul>{files}</ul>"))
        display(self.summary)
        display(self.top_ops)
        display(self.figure)


def profile(steps: int = 3, *, ranks=None, out: str | None = None, timeout: float = 300.0, rankset=None) -> Profile:
    """Profile the next ``steps`` steps of the trainer on ``ranks`` (default all); blocks until
    the traces are written (or ``timeout``: then the profiles are cancelled and it raises)."""
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    rs = rankset if rankset is not None else api.current()
    sel = rs.select(ranks)
    folder = _folder(out)
    partial = "" if len(sel) == rs.world_size else ",".join(map(str, sel))
    try:
        rs.apply(
            rpc.handle, rpc.Profile(action="arm", steps=int(steps), folder=str(folder), partial=partial), ranks=sel
        )
    except Exception:  # refused on some rank: leave none armed
        rs.apply(rpc.handle, rpc.Profile(action="cancel"), ranks=sel)
        raise
    deadline = time.monotonic() + timeout
    while True:
        states = rs.apply(rpc.handle, rpc.Profile(action="status"), ranks=sel)
        if all(s.done for s in states):
            break
        stuck = [r for r, s in zip(sel, states) if not s.done and s.trainer_state not in ("running", None)]
        if stuck or time.monotonic() > deadline:
            rs.apply(rpc.handle, rpc.Profile(action="cancel"), ranks=sel)
            why = (
                f"the trainer stopped on rank(s) {stuck} before {steps} steps were profiled"
                if stuck
                else f"no trace after {timeout:.0f} s"
            )
            raise RuntimeError(f"profile cancelled: {why}; the profiler is stopped on every rank")
        time.sleep(0.2)
    return _gather(rs, sel, states, folder)


def profile_cell(code: str, *, ranks=None, out: str | None = None, rankset=None) -> Profile:
    """Run ``code`` on the ranks (as ``%%distrain`` would, in their namespaces) under
    torch.profiler; the same traces, summary and timeline as :func:`profile`, one step."""
    rs = rankset if rankset is not None else api.current()
    sel = rs.select(ranks)
    folder = _folder(out)
    states = rs.apply(rpc.handle, rpc.Profile(action="code", code=code, folder=str(folder)), ranks=sel)
    return _gather(rs, sel, states, folder)


def _folder(out: str | None) -> pathlib.Path:
    folder = pathlib.Path(
        out
        or os.path.join(os.environ.get("WORKBENCH_RUN_DIR", "."), "profiles", time.strftime("profile-%Y%m%d-%H%M%S"))
    ).resolve()
    folder.mkdir(parents=True, exist_ok=True)
    return folder


def _gather(rs, sel, states, folder) -> Profile:
    from .dashboard.profile_figure import load_trace, profile_figure, summary_table, top_ops

    errors = [f"rank {r}: {s.error}" for r, s in zip(sel, states) if s.error]
    if errors:
        raise RuntimeError("profile failed: " + "; ".join(errors))
    files = {}
    for r, s in zip(sel, states):
        path = pathlib.Path(s.path)
        if not path.exists():  # a rank on another host wrote it there: bring it here
            path = folder / f"rank{r}.trace.json"
            path.write_bytes(rs.apply(rpc.handle, rpc.Profile(action="read"), ranks=[r])[0].data)
        files[r] = str(path)
    traces = {r: load_trace(p) for r, p in files.items()}
    return Profile(
        folder=str(folder),
        files=files,
        summary=summary_table(traces),
        top_ops=top_ops(traces),
        figure=profile_figure(traces),
    )
