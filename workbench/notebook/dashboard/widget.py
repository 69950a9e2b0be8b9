"""The dashboard's live plot widget: plotly's ``FigureWidget``, made fit to be redrawn from a
thread for as long as a run goes on, and to be shown, cleared and shown again.

plotly 7's ``FigureWidget`` is an anywidget; four things about it matter here, each handled by
the class :func:`widget_class` builds on first use (so that importing the dashboard does not
import plotly): a view's opening state, edits lost to a reply, pacing (:func:`widget_class`,
:func:`view_busy`) and views that were removed but still listen (:func:`fixed_esm`).
"""

from __future__ import annotations

import re
import threading
import time

_WIDGET_CLASS: list = [None]

# replaces plotly's default export: view handlers are registered on the render-time model
_DEFAULT_EXPORT = """
const __wbPlotlyWidget = %(inner)s;
export default () => {
  const inner = __wbPlotlyWidget();
  let rendering = null;
  return {
    initialize(ctx) {
      const model = ctx.model, on = model.on;
      model.on = (name, callback) => (rendering ? rendering.on(name, callback) : on(name, callback));
      return inner.initialize(ctx);
    },
    render(ctx) {
      rendering = ctx.model;
      try { return inner.render(ctx); } finally { rendering = null; }
    },
  };
};
"""
_EXPORT = re.compile(r"export\s*\{([^{}]*)\}\s*;?")


def fixed_esm(source: str) -> str | None:
    """plotly's widget module with its default export wrapped; None when the module's last export
    statement has no ``X as default`` (plotly's module is then used unchanged).

    Views that were removed still listen: plotly's view registers its handlers through the
    model object it got at *initialize*, which anywidget does not clean up when the view goes
    (a cleared or re-run output, a dashboard shown again elsewhere). The next edit reaches the
    removed view first, which throws on its purged plot ("Cannot read properties of undefined
    (reading 'length')"), and the views after it never get the edit: every other copy of the
    plot stops updating. The wrapped export makes handlers registered while a view renders go
    through that view's own model object, whose listeners anywidget removes with the view."""
    found = list(_EXPORT.finditer(source))
    if not found:
        return None
    last = found[-1]
    names = [part.strip() for part in last.group(1).split(",") if part.strip()]
    default = [n for n in names if re.fullmatch(r"[\w$]+\s+as\s+default", n)]
    if len(default) != 1:
        return None
    inner = default[0].split()[0]
    rest = [n for n in names if n is not default[0]]
    export = f"export{{{','.join(rest)}}};" if rest else ""
    return source[: last.start()] + export + _DEFAULT_EXPORT % {"inner": inner} + source[last.end() :]


def widget_class():
    """``go.FigureWidget`` fixed for live redraws (``LiveFigureWidget``, made once).

    * **Opening state.** A view draws first from the model's full state ``_widget_data`` /
      ``_widget_layout`` and afterwards only applies the ``_py2js_*`` edit messages it
      receives. plotly assigns that full state inside the constructor after ipywidgets has
      already opened the comm, and re-assigns it only in ``_repr_mimebundle_``, which never
      runs for a figure inside a ``VBox``: views would start from an empty figure. So the
      comm opens only once layout and every trace known in advance are set.
    * **Edits lost to a reply.** An edit message is a trait set to the message and at once
      back to ``None``. When a kernel thread handles a message from the browser for the same
      figure (plotly answers every edit with one), traitlets holds the figure's notifications
      and collapses a pair set meanwhile from the redraw thread into a single ``None``: the
      edit is lost. Incoming messages take ``_edit_lock``; ``figures.draw`` holds it while it
      sends edits.
    * **Pacing.** A view answers each edit it has drawn with its trace deltas
      (``_js2py_traceDeltas``, carrying the edit's id). The widget notes the last id answered
      so the dashboard can hold its next edit until the browser has caught up
      (:func:`view_busy`).
    * **Views that were removed still listen**: its module is :func:`fixed_esm`'s.
    """
    if _WIDGET_CLASS[0] is None:
        import pathlib

        import plotly.graph_objects as go

        esm = go.FigureWidget._esm
        path = getattr(esm, "_path", None) or getattr(esm, "path", None)
        try:
            source = pathlib.Path(path).read_text(encoding="utf-8") if path else str(esm)
        except OSError:
            source = str(esm)
        body = {"_esm": fixed_esm(source) or source}

        def __init__(self, *args, **kwargs):
            self._edit_lock = threading.RLock()
            self._answered = 0  # the last trace edit id a view answered (drew)
            self._sent_at = 0.0  # when the last trace edit was sent (figures.draw sets it)
            self._defer_open = True
            try:
                go.FigureWidget.__init__(self, *args, **kwargs)
            finally:
                self._defer_open = False
            self.open()  # now: the comm_open carries the full layout and data

        def open(self):
            # ipywidgets opens the comm inside the constructor, before plotly assigns
            # _widget_layout/_widget_data: the comm_open would carry an empty figure
            if not getattr(self, "_defer_open", False):
                go.FigureWidget.open(self)

        def set_state(self, sync_data):
            deltas = sync_data.get("_js2py_traceDeltas") if isinstance(sync_data, dict) else None
            if isinstance(deltas, dict) and isinstance(deltas.get("trace_edit_id"), int):
                self._answered = max(self._answered, deltas["trace_edit_id"])
            with self._edit_lock:  # never while figures.draw is sending edits
                return go.FigureWidget.set_state(self, sync_data)

        body.update(
            __init__=__init__,
            open=open,
            set_state=set_state,
            __doc__="plotly's FigureWidget, fixed for live redraws (see workbench.notebook.dashboard.widget)",
        )
        _WIDGET_CLASS[0] = type("LiveFigureWidget", (go.FigureWidget,), body)
    return _WIDGET_CLASS[0]


def view_busy(fig, timeout: float) -> bool:
    """True while no view has drawn the last edit sent, for at most ``timeout`` seconds.

    The kernel reads the views' answers only between cells, so while a cell runs the dashboard
    falls back to the timeout."""
    if not hasattr(fig, "_answered"):
        return False
    return fig._answered < fig._last_trace_edit_id and time.monotonic() - fig._sent_at < timeout
