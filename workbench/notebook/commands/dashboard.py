"""``%distrain dashboard``: live plots and controls of the run (``--export PATH`` for a file)."""

from __future__ import annotations

from ..session import UnknownSession
from . import flags
from .registry import UsageError, command


def _dashboard_args(p) -> None:
    p.add_argument("--export", default=None, metavar="PATH", help="write a standalone HTML file instead")
    flags.RUN.add(p, help="show this run (default: follow the latest)")
    flags.SESSION.add(
        p,
        help="the session whose run to show (default: the current one); several (a,b): their latest runs "
        "overlaid in one live dashboard",
    )
    p.was("--sessions", "--session", "the one way to name sessions")


@command(
    "dashboard", "live plots and controls of the run (--export PATH for a file)", _dashboard_args, session="several"
)
def _dashboard(args, shell):
    from ..dashboard import dashboard

    names = args.session
    try:
        if names is not None and len(names) > 1:
            for flag, value in (("--run", args.run), ("--export", args.export)):
                if value is not None:
                    raise UsageError(
                        f"{flag} goes with one session's dashboard, not with several (which follows each "
                        "session's latest run live); for a file of both: workbench.compare(...).write_html(PATH)"
                    )
            dashboard(session=list(names))
            return None
        dash = dashboard(run=args.run, show=args.export is None, session=names[0] if names else None)
    except UnknownSession as exc:
        raise UsageError(str(exc)) from None
    if args.export:
        path = dash.export_html(args.export)
        print(f"dashboard written to {path}")
    return None
