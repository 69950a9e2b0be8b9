"""The dashboard's step-timeline panel: the per-rank Gantt chart of the last steps, on demand.

Pulling the ranks' records is an ``apply`` on every rank, so the panel does it when asked
(its button, or :meth:`TimelinePanel.refresh`), never on the dashboard's redraw thread.
"""

from __future__ import annotations

import html

from . import timelines
from .timeline_figure import timeline_figure


class TimelinePanel:
    def __init__(self, rankset_getter, steps: int = 3):
        import ipywidgets as w
        import plotly.graph_objects as go

        self._rankset = rankset_getter
        self.steps = w.BoundedIntText(
            value=steps, min=1, max=200, description="last steps", layout=w.Layout(width="160px")
        )
        self.button = w.Button(description="draw step timeline", icon="bars", layout=w.Layout(width="170px"))
        self.message = w.HTML(value="<i>per-rank phases and collectives of the last steps: press to draw</i>")
        self.figure = go.FigureWidget()
        self.figure.layout.height = 10
        self.button.on_click(lambda _b: self.refresh())
        self.box = w.VBox([w.HBox([self.steps, self.button, self.message]), self.figure])

    def refresh(self) -> bool:
        """Pull the last steps from the ranks and redraw; False (and a message) when there are none."""
        try:
            recs = timelines.records(int(self.steps.value), rankset=self._rankset())
            if not recs:
                self.message.value = "<i>no steps recorded on the ranks yet</i>"
                return False
            fig = timeline_figure(recs)
        except Exception as exc:  # a click's exception would vanish into the kernel log
            self.message.value = (
                f"<span style='color:#c33'>{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</span>"
            )
            return False
        with self.figure.batch_update():
            self.figure.data = []
            self.figure.add_traces(list(fig.data))
            self.figure.layout = fig.layout
        ranks = len({r["rank"] for r in recs})
        drawn = len(fig.layout.yaxis.categoryarray) // 2  # two lanes a rank (past 16 ranks, the extremes)
        of = f" (of {ranks} ranks: the slowest, the fastest, the straggler)" if drawn < ranks else ""
        self.message.value = (
            f"<span class='wb-timeline-drawn'>{len(recs)} rank-steps pulled, {drawn} ranks drawn{of}</span>"
        )
        return True
