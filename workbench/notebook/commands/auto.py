"""``%distrain auto on|off``: plain cells run on the ranks, or in the notebook."""

from __future__ import annotations

from .. import api, auto_cells
from .registry import UsageError, command

AUTO_ON = "auto mode on: plain cells run on the ranks; magics and %%local cells run here"


def _auto_args(p) -> None:
    p.add_argument("state", choices=("on", "off"), help="on: plain cells run on the ranks; off: here")


@command("auto", "plain cells run on the ranks (on) or in the notebook (off)", _auto_args)
def _auto(args, shell):
    if shell is None:
        raise UsageError("`%distrain auto` needs an IPython shell (a notebook or IPython)")
    if args.state == "on":
        api.current()  # refuse before anything changes where no ranks run
        auto_cells.turn_on(shell)
        print(AUTO_ON)
    else:
        was_on = auto_cells.turn_off(shell)
        print("auto mode off: plain cells run in the notebook" if was_on else "auto mode was already off")
