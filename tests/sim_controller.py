"""A stand-in controller for SIMULATED ranks: the notebook's own ipyparallel client and rank set talk
to it as to a controller whose broadcast tree serves ``n`` engines, none of which exists.

A SIMULATION (benchmarks and tests that quote it say so). It answers the client's connection
request with ``n`` engines, and each request sent through the broadcast tree with one coalesced
reply for every simulated rank, as the tree's root sends it (each distinct reply once, with the
index of which rank gave which): for a cell, ``workbench.engine.rpc.fanned``'s
``(0, None, CellRun(published=0))`` of a quiet cell from every rank. So
the notebook does all of its own work for ``n`` ranks (sending, receiving and unpacking the
reply, the rank call, the output), while no engine, scheduler or rank process runs.

Run as a process, so that its work is not counted as the notebook's:
``python tests/sim_controller.py N FOLDER`` writes ``FOLDER/sim-client.json``, prints ``ready``
and serves until its stdin closes. Nothing here imports torch.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import uuid


@contextlib.contextmanager
def simulated_rankset(n: int, folder: str):
    """A ``RankSet`` of ``n`` SIMULATED ranks: the real notebook side (client, rank calls, output)
    in this process, the stand-in controller in a child process (ended on leaving)."""
    import ipyparallel as ipp

    from workbench.notebook.cluster import RankSet, RankSetConfig

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), *sys.path) if p)}
    proc = subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), str(n), folder],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    rs = None
    try:
        if proc.stdout.readline().strip() != b"ready":
            raise RuntimeError(f"the stand-in controller did not start (exit {proc.wait(10)})")
        rs = RankSet(RankSetConfig(n=n, backend="gloo"))
        rs.client = ipp.Client(os.path.join(folder, "sim-client.json"), timeout=30)
        rs.engine_ids = sorted(rs.client.ids)
        rs.fanout_from = 0  # the stand-in is a broadcast tree only
        yield rs
    finally:
        if rs is not None and rs.client is not None:
            rs.client.close()
        proc.stdin.close()
        proc.wait(30)


def serve(n: int, folder: str) -> None:
    import zmq
    from ipyparallel.serialize import serialize_object
    from jupyter_client.session import Session

    from workbench.notebook.cluster.controller_process import merge_replies
    from workbench.shared import replies

    key = uuid.uuid4().hex
    session = Session(key=key.encode(), signature_scheme="hmac-sha256", packer="json", unpacker="json")
    ctx = zmq.Context()
    sockets, ports = {}, {}
    for name, kind in (
        ("registration", zmq.ROUTER),
        ("broadcast", zmq.ROUTER),
        ("mux", zmq.ROUTER),
        ("task", zmq.ROUTER),
        ("control", zmq.ROUTER),
        ("iopub", zmq.PUB),
        ("notification", zmq.PUB),
    ):
        sock = ctx.socket(kind)
        ports[name] = sock.bind_to_random_port("tcp://127.0.0.1")
        sockets[name] = sock
    engines = {str(i): f"sim-{uuid.uuid4().hex[:8]}-{i}" for i in range(n)}
    info = {**ports, "ssh": "", "interface": "tcp://127.0.0.1", "task_scheme": "leastload", "key": key}
    info.update({"location": "127.0.0.1", "pack": "json", "unpack": "json", "signature_scheme": "hmac-sha256"})
    path = os.path.join(folder, "sim-client.json")
    with open(path, "w") as f:
        json.dump(info, f)
    # what a quiet cell's rank returns (engine.rpc.fanned), serialised as an engine does, and the
    # replies of n ranks as the tree's root sends them: merged by content (controller_process)
    quiet = serialize_object((0, None, replies.CellRun(published=0)))
    coalesced = {}
    poller = zmq.Poller()
    for name in ("registration", "broadcast"):
        poller.register(sockets[name], zmq.POLLIN)
    poller.register(sys.stdin.fileno(), zmq.POLLIN)
    print("ready", flush=True)
    while True:
        events = dict(poller.poll())
        if sys.stdin.fileno() in events:
            break
        query = sockets["registration"]
        if query in events:
            idents, msg = session.recv(query, mode=0)
            kind = msg["header"]["msg_type"]
            if kind == "connection_request":
                session.send(query, "connection_reply", {"status": "ok", "engines": engines}, parent=msg, ident=idents)
            elif kind == "queue_request":
                queues = {eid: {"queue": 0, "completed": 0, "tasks": 0} for eid in engines}
                session.send(query, "queue_reply", {"status": "ok", **queues}, parent=msg, ident=idents)
        tree = sockets["broadcast"]
        if tree in events:
            idents, msg = session.recv(tree, mode=0, content=True)
            targets = msg["metadata"]["targets"]
            metadata = {
                "is_broadcast": True,
                "is_coalescing": True,
                "original_msg_id": msg["header"]["msg_id"],
                "broadcast_targets": targets,
                "engine": targets[-1][0],
                "status": "ok",
                "dependencies_met": True,
            }
            session.send(
                tree,
                "apply_reply",
                {"status": "ok"},
                parent=msg,
                ident=idents,
                metadata=metadata,
                buffers=coalesced.setdefault(len(targets), merge_replies([quiet] * len(targets), merged=False)),
            )
    for sock in sockets.values():
        sock.close(linger=0)
    ctx.term()


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
