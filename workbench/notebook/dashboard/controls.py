"""The dashboard's buttons and status line (ipywidgets), wired to ``workbench.notebook.training``.

A click runs the same plain function the magics run, so a button can never do
something the Python API cannot. Errors from a click land in the status line (a
widget callback's exception would otherwise vanish into the kernel log).
"""

from __future__ import annotations

import html

from .. import training


class Controls:
    def __init__(self, rankset_getter, checkpoint=None):
        """``checkpoint()``: what the checkpoint button does (the dashboard passes a save into
        its session's checkpoints folder); without one the button is disabled."""
        import ipywidgets as w

        self._rankset = rankset_getter
        self._checkpoint = checkpoint
        self.pause = w.Button(description="pause", icon="pause", layout=w.Layout(width="90px"))
        self.resume = w.Button(description="resume", icon="play", layout=w.Layout(width="90px"))
        self.stop = w.Button(description="stop", icon="stop", button_style="danger", layout=w.Layout(width="80px"))
        self.lr = w.FloatText(description="lr", value=0.0, step=1e-4, layout=w.Layout(width="170px"))
        self._lr_shown = 0.0  # what follow_lr put in the box last
        self.set_lr = w.Button(description="set lr", layout=w.Layout(width="70px"))
        self.checkpoint = w.Button(
            description="checkpoint",
            icon="save",
            disabled=checkpoint is None,
            tooltip="save a checkpoint now" if checkpoint else "no checkpoint save for these ranks",
            layout=w.Layout(width="110px"),
        )
        self.status = w.HTML(value="<i>waiting for the first step</i>")
        self.message = w.HTML(value="")
        self.pause.on_click(lambda _b: self._do("paused", lambda: training.pause(rankset=self._rankset())))
        self.resume.on_click(lambda _b: self._do("resumed", lambda: training.resume(rankset=self._rankset())))
        self.stop.on_click(lambda _b: self._do("stop requested", lambda: training.stop(rankset=self._rankset())))
        self.set_lr.on_click(
            lambda _b: self._do(
                f"lr={self.lr.value:g} from the next step",
                lambda: training.set(self._rankset(), lr=float(self.lr.value)),
            )
        )
        self.checkpoint.on_click(lambda _b: self._do("checkpoint saved", self._save))
        self.box = w.VBox(
            [
                w.HBox([self.pause, self.resume, self.stop, self.lr, self.set_lr, self.checkpoint]),
                self.status,
                self.message,
            ]
        )

    def _do(self, done: str, fn) -> None:
        try:
            fn()
            self.message.value = f"<span style='color:#2a7'>{html.escape(done)}</span>"
        except Exception as exc:
            self.message.value = (
                f"<span style='color:#c33'>{html.escape(type(exc).__name__)}: {html.escape(str(exc))}</span>"
            )

    def follow_lr(self, lr: float | None) -> None:
        """Show the run's current lr in the box, unless the user has typed a new one there."""
        if lr is not None and self.lr.value == self._lr_shown and lr != self._lr_shown:
            self._lr_shown = lr
            self.lr.value = lr

    def _save(self):
        info = self._checkpoint()
        self.last_checkpoint = info
        return info
