"""The debug link between the notebook and its ranks: what a cell carries, and the signed wire.

Every message either way is JSON with an HMAC-SHA256 under the rank set's key (which reaches
the ranks inside the cell's request, through ipyparallel's signed channel), the hub's session
id and a number per sender: a message without a valid MAC, from another session, or replayed
is dropped. Pure: both sides import it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from dataclasses import dataclass, field

WIRE_VERSION = 1


@dataclass(frozen=True)
class LinkAddress:
    """Where a rank's debug link connects: the hub's ZMQ address, the key its messages are
    signed with, and the hub's session id (a rank's link from an earlier hub is refused)."""

    address: str
    key: bytes = field(repr=False)
    sid: str


@dataclass(frozen=True)
class CellOrigin:
    """The notebook cell a ``%%distrain`` cell's code comes from: the cell's path as
    JupyterLab's debugger names it (the kernel's ``dumpCell`` path) and how many of its lines
    come before the code (the ``%%distrain`` line), so that line L of the code is line
    L + ``offset`` of the cell."""

    path: str
    offset: int = 1


@dataclass(frozen=True)
class Breakpoint:
    """A breakpoint in notebook terms: a cell's path (or a file's) and a line of it."""

    path: str
    line: int
    condition: str | None = None


@dataclass(frozen=True)
class CellDebug:
    """What a cell's request carries about debugging.

    ``link``: where ``breakpoint()`` and the debugger talk to the notebook. ``origin``: the
    notebook cell the code comes from (None outside a kernel). ``visual``: JupyterLab's
    debugger is on: the cell runs under the rank's debugger, which stops at ``breakpoints``
    (and at ``breakpoint()``), and at an uncaught exception when ``exceptions`` holds
    ``uncaught``.
    """

    link: LinkAddress
    origin: CellOrigin | None = None
    visual: bool = False
    breakpoints: tuple[Breakpoint, ...] = ()
    exceptions: tuple[str, ...] = ()


def _mac(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()


def pack(key: bytes, message: dict) -> list[bytes]:
    """The frames of ``message``: its MAC, then its JSON."""
    payload = json.dumps(message, separators=(",", ":"), default=str).encode()
    return [_mac(key, payload), payload]


def unpack(key: bytes, frames: list[bytes]) -> dict | None:
    """The message of two frames with a valid MAC; None for anything else."""
    if len(frames) != 2:
        return None
    mac, payload = frames
    if not hmac.compare_digest(bytes(mac), _mac(key, bytes(payload))):
        return None
    try:
        message = json.loads(payload)
    except ValueError:
        return None
    return message if isinstance(message, dict) else None


class Replay:
    """Sequence numbers seen per sender: a message is fresh once (numbers only go up)."""

    def __init__(self) -> None:
        self._last: dict[str, int] = {}

    def fresh(self, sender: str, seq) -> bool:
        if not isinstance(seq, int) or seq <= self._last.get(sender, 0):
            return False
        self._last[sender] = seq
        return True
