"""``%distrain layout``: which shard of which tensor lives on which rank."""

from __future__ import annotations

from ...engine import rpc
from ...shared.argtypes import positive_int
from .. import api
from . import flags
from .registry import UsageError, command


def _layout_args(p) -> None:
    p.add_argument("--tensor", default=None, help="draw this tensor's blocks and which ranks hold them")
    p.add_argument("--match", default=None, help="only tensors whose name matches this regex")
    p.add_argument("--max", type=positive_int, default=24, help="at most this many tensors (largest first)")
    flags.SESSION.add(p)


@command("layout", "which shard of which tensor lives on which rank", _layout_args)
def _show_layout(args, shell):
    from ..dashboard.layout_figure import layout_figure, tensor_figure

    layouts = [lay.to_dict() for lay in api.current().apply(rpc.handle, rpc.Layout())]
    if args.tensor:
        try:
            return tensor_figure(layouts, args.tensor)
        except KeyError as exc:
            raise UsageError(str(exc.args[0])) from None
    return layout_figure(layouts, max_tensors=args.max, match=args.match)
