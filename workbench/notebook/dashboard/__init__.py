"""The live training dashboard (notebook side): a plotly FigureWidget, ipywidgets controls.

``workbench.dashboard()`` (or ``%distrain dashboard``) shows the latest run in one figure
(``figures.make_figure`` says why one), the trainer's controls and a status line. A background
thread redraws at most every ``interval`` seconds and only when new events arrived, so plotting
costs the ranks nothing (they only PUSH to a socket) and the kernel little. Owns the session's
``dashboard`` part.
"""

from __future__ import annotations

import html
import sys
import types

from .. import api, session, stream
from ..keywords import refuse
from . import figures
from .controls import Controls
from .live_view import LiveView, import_heavy

__all__ = ["Dashboard", "dashboard"]

_FAILED = "<span class='wb-redraw-failed' style='color:#c33'>"
MOVED = (
    "<i class='wb-dashboard-moved'>the live dashboard moved to where it was opened last "
    "(<code>%distrain dashboard</code> shows it again)</i>"
)


class Dashboard(LiveView):
    """Loss, throughput, memory, collective time, the step-time breakdown and the gradient norm of
    the latest run, pause/resume/stop, an lr box, a checkpoint button and a status line. Calling
    ``dashboard()`` again re-shows the same live dashboard; :meth:`export_html` writes a
    standalone page."""

    def __init__(self, rankset=None, *, run: str | None = None, interval: float = 0.5, live: bool = True):
        self.rankset = rankset if rankset is not None else api.current()
        self.store = stream.attach(self.rankset).store
        self.run = run  # None: follow the latest run
        import_heavy()  # never first imported by the redraw thread (see live_view.import_heavy)
        try:
            ranks = list(range(self.rankset.world_size))
        except Exception:  # a rank set that cannot say: traces are added as they appear
            ranks = None
        self.figure = figures.make_figure(widget=True, ranks=ranks)
        self.controls = Controls(lambda: self.rankset, checkpoint=self.save_checkpoint)
        self._hint: tuple | None = None  # (run, step, text) of the rollback hint last shown
        self._timeline = None  # the step-timeline panel, made with the widget
        self._box = None
        self._shown = None  # the display handle of where it is shown
        self._version = -1
        self._start(interval, live, "workbench-dashboard")

    # ---------------------------------------------------------------- drawing
    def current_run(self) -> str | None:
        return self.run or self.store.latest_run()

    def _refresh(self, paced: bool) -> bool:
        """Redraw; ``paced``: not while the browser is still drawing the last edit (the
        status line is updated either way: it is cheap to draw)."""
        version = self.store.version
        if version == self._version:
            return False
        run = self.current_run()
        if run is None:
            return False
        self.controls.status.value = self.status_line(run)
        last = self.store.last_steps(run)
        self.controls.follow_lr(self.store.last(run, "lr", min(last)) if last else None)
        if paced and self._busy():
            return False  # drawn at a later tick, with everything that arrived meanwhile
        self._version = version
        self._drew(figures.draw(self.figure, figures.lines_for(self.store, run)))
        figures.mark_recoveries(self.figure, self._recoveries(run))
        if self.controls.message.value.startswith(_FAILED):
            self.controls.message.value = ""  # drawing works again
        return True

    def _show_failure(self, exc: Exception) -> None:
        self.controls.message.value = f"{_FAILED}redraw failed: {html.escape(str(exc))}</span>"

    def status_line(self, run: str) -> str:
        """One line of the run's state; a failed auto-save (training went on) on a red line below."""
        s = self.store
        states = s.run_state(run)
        last = s.last_steps(run)
        state_text = ", ".join(sorted({e["state"] for e in states.values()})) or "starting"
        reasons = {e["reason"] for e in states.values() if e["reason"] and e["state"] in ("paused", "error", "stopped")}
        loss, mfu, lr = (s.last(run, m, min(last)) if last else None for m in ("loss", "mfu", "lr"))
        total_tps = sum(v for r in last if (v := s.last(run, "tps", r)) is not None)
        quorum = s.last(run, "quorum", max(last, key=last.get)) if last else None  # --fault-tolerant runs
        supervised = session.of(self.rankset).runs.current  # what watches the run: a budget recovering...
        if supervised is not None and supervised.run_id == run and supervised.state != state_text:
            state_text += f" · {supervised.kind}: {supervised.state}"
        parts = [
            f"<b>{html.escape(run)}</b>",
            f"step {max(last.values()) if last else 0}",
            f"<b class='wb-run-state'>{html.escape(state_text)}</b>",
            f"{len(last)} ranks",
            *([f"<b class='wb-quorum'>quorum {int(quorum)}</b>"] if quorum is not None else []),
            f"loss {loss:.4g}" if loss is not None else "loss -",
            f"lr {lr:.3g}" if lr is not None else "lr -",
            f"{total_tps:,.0f} tokens/s",
            f"mfu {mfu:.1%}" if mfu is not None else "mfu n/a (no device peak: CPU)",
            f"lag {s.lag_s:.2f} s",
            f"events {s.received}",
            f"gaps {s.gaps}, duplicates {s.duplicates}" + (f", rollbacks {s.rollbacks}" if s.rollbacks else ""),
        ]
        line = " · ".join(parts)
        if reasons:
            line += "<br><span style='color:#c60'>" + html.escape("; ".join(sorted(reasons))[:500]) + "</span>"
        paused_on_loss = [
            e
            for e in states.values()
            if e["state"] == "paused" and any(w in (e["reason"] or "") for w in ("non-finite", "spike"))
        ]
        if paused_on_loss:
            line += (
                "<br><span class='wb-rollback-hint' style='color:#c60'>"
                + html.escape(
                    self.rollback_hint(
                        run,
                        max(e["step"] or 0 for e in paused_on_loss),
                        spike=all("spike" in e["reason"] for e in paused_on_loss),
                    )
                )
                + "</span>"
            )
        recovered = self._recoveries(run)
        if recovered:
            from ..runs import describe

            line += (
                "<br><span class='wb-recoveries' style='color:#c00'>"
                + html.escape("recovered: " + " | ".join(describe(r) for r in recovered))[:1200]
                + "</span>"
            )
        failed = autosave_failure(s, run)
        if failed:
            line += "<br><span style='color:#c00'>" + html.escape(failed[:600]) + "</span>"
        return line

    def _recoveries(self, run: str) -> list[dict]:
        with self.store.lock:
            return [r for r in self.store.recoveries if r.get("run") == run]

    def save_checkpoint(self) -> dict:
        """The checkpoint button: save now into the session's checkpoints folder."""
        from .. import checkpoints

        return checkpoints.save(rankset=self.rankset, root=session.of(self.rankset).checkpoint_dir)

    def rollback_hint(self, run: str, step: int, spike: bool = False) -> str:
        """Which checkpoint to load after a NaN/spike pause (worked out once per pause)."""
        if self._hint is None or self._hint[:2] != (run, step):
            from .. import checkpoints

            loss = self.store.last(run, "loss", 0) if spike else None  # None: said as NaN/Inf
            text = checkpoints.rollback_hint(step, loss, root=session.of(self.rankset).checkpoint_dir)
            self._hint = (run, step, text)
        return self._hint[2]

    # ---------------------------------------------------------------- showing
    @property
    def widget(self):
        import ipywidgets as w

        if self._box is None:
            from .timeline_panel import TimelinePanel

            self._timeline = TimelinePanel(lambda: self.rankset)
            self._box = w.VBox([self.controls.box, self.figure, self._timeline.box])
        return self._box

    @property
    def timeline(self):
        """The step-timeline panel (per-rank Gantt chart of the last steps, drawn on demand)."""
        _ = self.widget  # builds the panels, the timeline among them
        return self._timeline

    def show(self) -> Dashboard:
        """Show the dashboard here; where it was shown before, a line says it moved.

        One live copy at a time: every copy in the page redraws on every edit, and a copy
        further up the notebook, following the same latest run, only doubles that work.
        """
        from IPython.display import HTML, display

        self.refresh()
        self.sync()  # the new view draws what the figure holds now
        if self._shown is not None:
            self._shown.update(HTML(MOVED))
        self._shown = display(self.widget, display_id=True)
        return self

    def export_html(self, path, run: str | None = None) -> str:
        """Write the dashboard of ``run`` (default: what it shows) as one standalone HTML file."""
        run = run or self.current_run()
        static = figures.make_figure(widget=False, ranks=self.store.ranks(run) if run is not None else None)
        if run is not None:
            figures.draw(static, figures.lines_for(self.store, run))
        plot = static.to_html(include_plotlyjs=True, full_html=False)
        status = self.status_line(run) if run else "no run yet"
        page = (
            "<!DOCTYPE html><html><head><meta charset='utf-8'><title>distrain workbench: "
            f"{html.escape(run or '')}</title></head><body style='font-family:sans-serif'>"
            f"<h2>distrain workbench</h2><p>{status}</p>" + plot + "</body></html>"
        )
        with open(path, "w", encoding="utf-8") as f:
            f.write(page)
        return str(path)


def dashboard(
    rankset=None, *, run: str | None = None, show: bool = True, interval: float = 0.5, session=None, **earlier
) -> Dashboard:
    """The live dashboard of the current ranks (the same one when called again).

    ``session``: a session's name (its dashboard), or a list of names (``["ddp", "fsdp"]``): one
    live dashboard of all their latest runs, each trace named by its session (an
    :class:`overlay.Overlay`).
    """
    refuse("workbench.dashboard", earlier, {"sessions": "session"})
    if isinstance(session, (list, tuple)):
        if rankset is not None or run is not None:
            raise ValueError(
                "session=[...] shows the latest run of each session named; rankset= and run= choose one "
                "session's dashboard: pass one or the other"
            )
        from .overlay import overlay

        return overlay(session, show=show, interval=interval)
    if session is not None:
        if rankset is not None:
            raise ValueError("session= and rankset= both choose the ranks: pass one or the other")
        rankset = api.running_set(session)
    rs = rankset if rankset is not None else api.current()
    sess = api.KERNEL.of(rs)  # (`session` is the keyword here)
    dash = sess.dashboard.live
    if dash is None or dash.closed or dash.rankset is not rs:
        dash = sess.dashboard.live = Dashboard(rs, run=run, interval=interval)
    elif run is not None:
        dash.run = run
    if show:
        dash.show()
    return dash


def _follow(rankset) -> None:
    """A recovery's new ranks go on with the session's run: the same live dashboard follows it."""
    sess = session.of(rankset)
    dash = sess.dashboard.live
    if sess.runs.recovering and dash is not None and not dash.closed:
        dash.rankset = rankset


def close(sess) -> None:
    """Close the session's live dashboard (drawn once more with what arrived last)."""
    dash, sess.dashboard.live = sess.dashboard.live, None
    if dash is not None:
        dash.refresh()
        dash.close()


def _close_for(rankset) -> None:
    sess = session.of(rankset)
    if sess.runs.recovering:  # the same run goes on on new ranks: the recovery hands it their set
        return
    close(sess)


api.on("stopping", _close_for)
api.on("started", _follow)


class _CallableModule(types.ModuleType):
    """``workbench.dashboard()`` and ``import workbench.dashboard`` name the same thing."""

    def __call__(self, *args, **kwargs):
        return dashboard(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule


def autosave_failure(store, run: str) -> str | None:
    """The latest auto-save's outcome for ``run`` when it failed (rank 0's log line), else None.

    The ranks' auto-save hook logs ``auto-save: saved ...`` or ``auto-save failed ...``
    (``workbench.engine.checkpoint_hooks``); a later success clears the warning.
    """
    with store.lock:
        logs = list(store.logs)
    for e in reversed(logs):
        text = e.get("text", "")
        if e.get("run") in (run, "checkpoints") and text.startswith("auto-save"):
            return text if text.startswith("auto-save failed") else None
    return None
