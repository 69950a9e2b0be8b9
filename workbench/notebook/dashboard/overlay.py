"""The live dashboard of several named sessions at once (``workbench.dashboard(session=[...])``,
``%distrain dashboard --session ddp,fsdp``): the same panels as one session's dashboard, each
session's latest run drawn into them with its traces named by the session, redrawn as they train.
It reads the sessions' event stores, never the ranks, so a session stopped meanwhile keeps its
last lines while the others go on; it stops redrawing once none of them runs.
"""

from __future__ import annotations

import html

from .. import api, session, stream
from . import figures
from .live_view import LiveView, import_heavy

__all__ = ["Overlay", "overlay"]

COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf")


class Overlay(LiveView):
    """One live figure of the latest runs of ``names`` (named sessions of this kernel)."""

    def __init__(self, names, *, interval: float = 0.5, live: bool = True):
        import ipywidgets as w

        self.names = tuple(names)
        for name in self.names:
            stream.last_store(name)  # attach a running session's stream here, not in the redraw thread
        import_heavy()
        self.colours = {n: COLOURS[i % len(COLOURS)] for i, n in enumerate(self.names)}
        self.figure = figures.make_figure(widget=True)
        for name in self.names:  # the loss lines exist from the start (see figures.make_figure)
            self.figure.add_trace(figures._trace("loss", name, [], [], {"width": 3, "color": self.colours[name]}))
        self.figure.update_layout(title={"text": "sessions: " + ", ".join(self.names), "x": 0.01})
        self.status = w.HTML()
        self._versions: tuple = ()
        self._box = None
        self._start(interval, live, "workbench-overlay")

    # ---------------------------------------------------------------- drawing
    def stores(self) -> dict:
        """name -> the session's event store (None before its stream was ever attached)."""
        return {n: session.KERNEL.get(n).store for n in self.names}

    def lines(self) -> dict[str, list[tuple]]:
        """panel -> [(trace name, xs, ys, style)] of every session's latest run.

        The loss panel holds one line per session (its data-parallel mean, in the session's
        colour), so two layouts read as one comparison, as :func:`workbench.compare` draws once;
        the other panels hold each session's lines under ``"<session> <line>"``, step-time phases
        as lines (stacked bars of two sessions would add them up)."""
        out: dict[str, list[tuple]] = {key: [] for key in figures.PANEL_KEYS}
        for name, store in self.stores().items():
            run = store.latest_run() if store is not None else None
            if run is None:
                continue
            for panel, traces in figures.lines_for(store, run).items():
                for line, xs, ys, style in traces:
                    if panel == "loss":
                        if line == "mean":
                            out["loss"].append((name, xs, ys, {"width": 3, "color": self.colours[name]}))
                        continue
                    style = {"width": 1} if style.get("bar") else style
                    if panel == "grad_norm":
                        style = {"width": 2, "color": self.colours[name]}
                    out[panel].append((f"{name} {line}", xs, ys, style))
        return out

    def _refresh(self, paced: bool) -> bool:
        """Redraw if any session's store changed since the last redraw (see ``LiveView.refresh``)."""
        stores = self.stores()
        versions = tuple((id(s), s.version) if s is not None else None for s in stores.values())
        if versions == self._versions:
            return False
        self.status.value = self.status_html(stores)
        if paced and self._busy():
            return False
        self._versions = versions
        self._drew(figures.draw(self.figure, self.lines()))
        return True

    def status_html(self, stores: dict) -> str:
        """One line per session: its run, step, state, latest loss and throughput."""
        rows = []
        for name, store in stores.items():
            run = store.latest_run() if store is not None else None
            head = f"<b style='color:{self.colours[name]}'>{html.escape(name)}</b>"
            if run is None:
                rows.append(f"{head} · no run yet")
                continue
            last = store.last_steps(run)
            states = ", ".join(sorted({e["state"] for e in store.run_state(run).values()})) or "starting"
            loss = store.last(run, "loss", min(last)) if last else None
            tps = sum(v for r in last if (v := store.last(run, "tps", r)) is not None)
            running = session.KERNEL.get(name).running
            rows.append(
                " · ".join(
                    [
                        head,
                        html.escape(run),
                        f"step {max(last.values()) if last else 0}",
                        f"<b>{html.escape(states)}</b>" + ("" if running else " (ranks stopped)"),
                        f"loss {loss:.4g}" if loss is not None else "loss -",
                        f"{tps:,.0f} tokens/s",
                    ]
                )
            )
        return "<br>".join(rows)

    def _show_failure(self, exc: Exception) -> None:
        self.status.value += f"<br><span style='color:#c33'>redraw failed: {html.escape(str(exc))}</span>"

    # ---------------------------------------------------------------- showing
    @property
    def widget(self):
        import ipywidgets as w

        if self._box is None:
            self._box = w.VBox([self.status, self.figure])
        return self._box

    def show(self) -> Overlay:
        from IPython.display import display

        self.refresh()
        self.sync()
        display(self.widget)
        return self

    def close(self) -> None:
        super().close()
        self.refresh()  # the last events of every session
        self.sync()


def overlay(names, *, show: bool = True, interval: float = 0.5) -> Overlay:
    """The live overlay of the named sessions ``names`` (the same one when asked again)."""
    names = tuple(dict.fromkeys([names] if isinstance(names, str) else names))
    if not names:
        raise ValueError("name the sessions to overlay, e.g. session=['ddp', 'fsdp']")
    for name in names:
        session.KERNEL.get(name)  # an unknown name: the error lists the sessions there are
    over = session.KERNEL.overlays.get(names)
    if over is None or over.closed:
        over = session.KERNEL.overlays[names] = Overlay(names, interval=interval)
    if show:
        over.show()
    return over


def _stopping(rankset) -> None:
    """A session stops: its overlays draw its last events; one with no session left running ends."""
    stopping = session.of(rankset).name
    for names, over in list(session.KERNEL.overlays.items()):
        if stopping not in names:
            continue
        over.refresh()
        if not any(session.KERNEL.get(n).running for n in names if n != stopping):
            over.close()
            del session.KERNEL.overlays[names]


api.on("stopping", _stopping)
