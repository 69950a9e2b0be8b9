"""What the live dashboard and the sessions overlay share: one plotly figure redrawn by a thread
of its own at most every ``interval`` seconds, an edit held while the browser still draws the
last one (:func:`widget.view_busy`), and the figure's full state assigned now and then so that
a view shown later starts from it (``figures.sync``)."""

from __future__ import annotations

import threading
import time

from . import figures
from .widget import view_busy


class LiveView:
    """A subclass sets ``figure``, implements ``_refresh(paced)`` (calling :meth:`_drew` after
    drawing), ``_show_failure(exc)`` and ``show()``, then calls :meth:`_start`."""

    SYNC_EVERY = 5.0
    VIEW_TIMEOUT = 3.0  # hold an edit at most this long for a view to draw the last one

    def _start(self, interval: float, live: bool, thread_name: str) -> None:
        self.interval = interval
        self.redraws = 0
        self._synced = 0.0  # when the figure's full state was last assigned (figures.sync)
        self._sync_pending = False
        self._lock = threading.RLock()  # one redraw at a time (the thread's, or show()'s)
        self._closed = threading.Event()
        self._thread = None
        if live:
            self._thread = threading.Thread(target=self._loop, name=thread_name, daemon=True)
            self._thread.start()

    def refresh(self) -> bool:
        """Redraw now if anything arrived since the last redraw; True when it redrew."""
        with self._lock:
            return self._refresh(paced=False)

    def _refresh(self, paced: bool) -> bool:
        raise NotImplementedError

    def _busy(self) -> bool:
        """Whether the browser still draws the last edit (then the next one waits)."""
        return view_busy(self.figure, self.VIEW_TIMEOUT)

    def _drew(self, added: bool) -> None:
        """After a redraw: views made from now on (a re-display) draw the full state, so it
        is assigned when traces were added, else every few seconds."""
        if added or time.monotonic() - self._synced >= self.SYNC_EVERY:
            self.sync()
        else:
            self._sync_pending = True
        self.redraws += 1

    def sync(self) -> None:
        """Assign the figure's full state now (see ``figures.sync``)."""
        with self._lock:
            self._sync_pending = False
            self._synced = time.monotonic()
            figures.sync(self.figure)

    def panel(self, key: str) -> list:
        """The traces of one panel (``figures.PANEL_KEYS``: loss, throughput, memory, ...)."""
        if key not in figures.PANEL_KEYS:
            raise KeyError(f"no dashboard panel {key!r}; the panels are {', '.join(figures.PANEL_KEYS)}")
        return figures.panel_traces(self.figure, key)

    def _loop(self) -> None:
        from ..background import lower_this_thread

        lower_this_thread()  # gives way to ranks training on the same cores
        while not self._closed.wait(self.interval):
            try:
                with self._lock:
                    redrew = self._refresh(paced=True)
                if not redrew and self._sync_pending and not self._busy():
                    self.sync()  # nothing new arrived: bring the full state up to date once
            except Exception as exc:  # keep drawing; say what went wrong
                self._show_failure(exc)

    def _show_failure(self, exc: Exception) -> None:
        raise NotImplementedError

    def _ipython_display_(self):
        self.show()

    def close(self) -> None:
        self._closed.set()
        if self._thread is not None:
            self._thread.join(2 * self.interval + 1)
        if self._sync_pending:
            self.sync()

    @property
    def closed(self) -> bool:
        return self._closed.is_set()


def import_heavy() -> None:
    """Import what a redraw may import, here, before the redraw thread starts.

    plotly's validators look for pandas/numpy in ``sys.modules``; were the main thread
    importing pandas (``workbench.metrics()``) while the redraw thread validated a trace,
    the thread would meet a half-initialized module ("partially initialized module
    'pandas' has no attribute 'Series'").
    """
    import ipywidgets  # noqa: F401
    import numpy  # noqa: F401
    import pandas  # noqa: F401
    import plotly.graph_objects  # noqa: F401
