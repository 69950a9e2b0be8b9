"""``%distrain pipeline``: the latest pipeline step as it ran beside the bubble formula."""

from __future__ import annotations

from . import flags
from .registry import UsageError, command


def _pipeline_args(p) -> None:
    flags.SESSION.add(p)


@command(
    "pipeline",
    "the latest pipeline step as it ran: micro-batch x stage blocks beside the bubble formula",
    _pipeline_args,
)
def _pipeline(args, shell):
    from ...shared.errors import WorkbenchError
    from ..dashboard import timelines

    try:
        return timelines.pipeline_schedule()
    except WorkbenchError as exc:  # the rank's ValueError, raised naming the rank
        raise UsageError(str(exc).splitlines()[0]) from None
    except ValueError as exc:
        raise UsageError(str(exc)) from None
