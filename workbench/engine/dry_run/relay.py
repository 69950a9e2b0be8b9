"""Pipeline stage metadata between the dry run's position processes.

Before its first step, torch's pipeline schedule has every stage tell the next one the
shapes of what it sends (``PipelineStage._send_meta`` / ``_recv_meta``, pickled objects
over point-to-point sends), and the gradients' shapes back. The fake process group carries
no data, so here each stage hands those objects to the dry run's parent instead, which
gives them to the stage that asks (one position stands for every rank of its stage).
Messages are length-prefixed pickles on a socket pair.
"""

from __future__ import annotations

import pickle
import socket
import struct
from collections import Counter

__all__ = ["send_msg", "recv_msg", "relay_stage"]

_LEN = struct.Struct("!Q")


def send_msg(sock: socket.socket, obj) -> None:
    data = pickle.dumps(obj)
    sock.sendall(_LEN.pack(len(data)) + data)


def _exactly(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise EOFError("the other end closed")
        buf += chunk
    return bytes(buf)


def recv_msg(sock: socket.socket):
    (n,) = _LEN.unpack(_exactly(sock, _LEN.size))
    return pickle.loads(_exactly(sock, n))


def relay_stage(stage, sock: socket.socket) -> None:
    """Route ``stage``'s metadata sends and receives through the parent on ``sock``."""
    sent: Counter = Counter()
    got: Counter = Counter()

    def send_meta(meta, dst_stage: int) -> None:
        key = (stage.stage_index, dst_stage)
        send_msg(sock, ("send", (*key, sent[key]), pickle.dumps(meta)))
        sent[key] += 1

    def recv_meta(src_stage: int):
        key = (src_stage, stage.stage_index)
        send_msg(sock, ("recv", (*key, got[key])))
        got[key] += 1
        return pickle.loads(recv_msg(sock))

    stage._send_meta = send_meta
    stage._recv_meta = recv_meta
