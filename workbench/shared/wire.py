"""What the notebook and a rank's processes agree on outside :mod:`workbench.engine.rpc`'s
requests: the start-up process's imports and ready line, the environment a launcher hands
a rank, the guard's signed lifeline lines, the broadcast tree's end-of-output marker.

Pure standard library: the guard and the preload read this before torch or an engine exists.
"""

from __future__ import annotations

import hashlib
import hmac
import json

# what each framework's ranks import before they fork (``engine.preload``; the same lines
# run as the engines' startup command: ``notebook.cluster.launchers.preload_command``)
PRELOADS = {"torch": ("torch", "torch.distributed"), "jax": ("jax", "jax.numpy")}
# printed by the forking preload once its imports are done (the notebook reads its output)
READY = "workbench preload: imported, waiting for the ranks to fork"

# ranks from which a set starts as large sets do: on one host its group meets in a file store
# (torch's TCP store names each connection by a reverse DNS lookup, and tens at once wait out
# the resolver), and gloo connects a pair of ranks when they first talk (``runtime.lazy_gloo``)
LARGE_LOCAL_FROM = 32

# which --hosts entry (SSH) or bundle (Ray) started a rank: the rank order follows it
ENV_HOST_SLOT = "WORKBENCH_HOST_SLOT"

# the lifeline between a rank's guard (``engine.guard``) and the notebook (``cluster.lifeline``)
ENV_LIFELINE = "WORKBENCH_LIFELINE"
ENV_LIFELINE_KEY = "WORKBENCH_LIFELINE_KEY"
BEAT_S = 0.5  # a guard's beat line this often; the notebook allows ``lifeline.HOST_SILENCE_S`` of silence

# the data message a rank sends after its output for a call through the broadcast tree
OUTPUT_DONE = "_workbench_output_done"


def sign(key: bytes, body: str) -> bytes:
    """One lifeline line: the HMAC-SHA256 of ``body`` under ``key``, then ``body``."""
    return (hmac.new(key, body.encode(), hashlib.sha256).hexdigest() + " " + body + "\n").encode()


def verify(key: bytes, line: bytes) -> dict | None:
    """The message of a signed line, or None if its HMAC does not match."""
    mac, _, body = line.decode(errors="replace").rstrip("\n").partition(" ")
    good = hmac.new(key, body.encode(), hashlib.sha256).hexdigest()
    if not hmac.compare_digest(mac, good):
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None
