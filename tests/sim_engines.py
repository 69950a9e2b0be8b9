"""Stand-in engines for SIMULATED ranks against the REAL controller: ``n`` lightweight engines in
one process, each registered with ipyparallel's controller as an engine registers, so that the
controller, its schedulers and the broadcast tree do all of their work for ``n`` ranks.

A SIMULATION (benchmarks and tests that quote it say so). Each stand-in has an engine's own
sockets and identity (``ipyparallel/engine/app.py``): a DEALER that sends the
``registration_request`` (asking for id ``i``), then a shell ROUTER connected to the mux, the
task queue and broadcast leaf ``id % leaves``, a control ROUTER, an IOPub PUB, and a heart
(a SUB on the controller's pings, a DEALER that sends each ping back as its pong, as
``heartmonitor.Heart`` does). No IPython kernel, no torch: an ``apply_request`` is unpacked as
the engine unpacks it (``unpack_apply_message``) and answered as ``workbench.engine.rpc.fanned``
answers: a ``%%distrain`` cell (``rpc.handle(RunCell)``) runs with ``exec`` in the stand-in's
own namespace (``rank``, ``world_size`` set as the bootstrap sets them), what it prints sent
on IOPub as one stream message a stream, then the end-of-output marker; a quiet cell gives
``(0, None, CellRun(published=0))`` and publishes nothing. ``%distrain push``/``pull`` through
the tree (``rpc.SetNames``/``rpc.GetName``) set and read that namespace. Anything else is
answered with an error naming the request.

Sockets: 7 a stand-in, 14 file descriptors each as measured (14,345 for 1024 stand-ins in the
one process); ``RLIMIT_NOFILE`` is raised to 15 a stand-in (within the hard limit), and the ZMQ
context's socket limit (1023 by default) to what the count needs.

Run as a process (``python tests/sim_engines.py N ENGINE_JSON``: prints ``registering``
before the first request, ``registered`` once all have their ids, serves until its stdin
closes), started by :func:`standin_rankset`, which starts the real controller as a rank set
does (``launchers.cluster_kwargs``: the broadcast tree's depth for ``n`` included).
"""

from __future__ import annotations

import contextlib
import glob
import io
import json
import os
import resource
import selectors
import subprocess
import sys
import time
import uuid

SOCKETS_PER_ENGINE = 7
FDS_PER_ENGINE = 15  # at most: the 7 sockets and their 8 TCP connections (shell: mux, task, broadcast); 14 measured


def raise_fd_limit(n: int) -> int:
    """Raise this process's descriptor limit for ``n`` stand-ins; the limit now in effect."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = FDS_PER_ENGINE * n + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        new = want if hard == resource.RLIM_INFINITY else min(want, hard)
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
        soft = new
    if soft != resource.RLIM_INFINITY and soft < want:
        raise RuntimeError(f"{n} stand-in engines need {want} file descriptors; the hard limit is {hard}")
    return soft


class StandIn:
    """One engine: its identity, session, sockets and user namespace."""

    def __init__(self, index: int, n: int, ctx, info: dict):
        import zmq
        from jupyter_client.session import Session

        self.index = index
        self.ident = str(uuid.uuid4())
        self.bident = self.ident.encode()
        self.info = info
        self.session = Session(
            key=info["key"].encode(),
            signature_scheme=info["signature_scheme"],
            packer=info["pack"],
            unpacker=info["unpack"],
            session=self.ident,
        )
        self.ctx = ctx
        self.id: int | None = None
        self.ns: dict = {"rank": index, "world_size": n}
        self.reg = ctx.socket(zmq.DEALER)
        self.reg.IDENTITY = self.bident
        self.reg.connect(f"{info['interface']}:{info['registration']}")
        self.shell = self.control = self.iopub = self.ping = self.pong = None

    def register(self) -> None:
        self.session.send(self.reg, "registration_request", content={"uuid": self.ident, "id": self.index})

    def registered(self, frames: list) -> None:
        """The controller's reply: the engine's id; its sockets connected, its heart started."""
        import zmq

        _, msg = self.session.feed_identities(frames)
        content = self.session.deserialize(msg)["content"]
        if content["status"] != "ok":
            raise RuntimeError(f"stand-in {self.index} refused: {content}")
        self.id = content["id"]
        info = self.info

        def url(key, port=None):
            return f"{info['interface']}:{info[key] if port is None else port}"

        leaves = info["broadcast"]
        self.shell = self.ctx.socket(zmq.ROUTER)
        self.shell.IDENTITY = self.bident
        for addr in (url("mux"), url("task"), url("broadcast", leaves[self.id % len(leaves)])):
            self.shell.connect(addr)
        self.control = self.ctx.socket(zmq.ROUTER)
        self.control.IDENTITY = self.bident
        self.control.connect(url("control"))
        self.iopub = self.ctx.socket(zmq.PUB)
        self.iopub.SNDHWM = 0
        self.iopub.IDENTITY = self.bident
        self.iopub.connect(url("iopub"))
        self.ping = self.ctx.socket(zmq.SUB)
        self.ping.setsockopt(zmq.SUBSCRIBE, b"")
        self.ping.connect(url("hb_ping"))
        self.pong = self.ctx.socket(zmq.DEALER)
        self.pong.IDENTITY = self.bident
        self.pong.connect(url("hb_pong"))

    def beat(self, frames: list) -> None:
        self.pong.send_multipart(frames)  # the heart forwards each ping as it came

    def request(self, frames: list) -> None:
        idents, msg = self.session.feed_identities(frames, copy=True)
        msg = self.session.deserialize(msg, content=True, copy=True)
        kind = msg["header"]["msg_type"]
        parent_md = msg.get("metadata") or {}
        md = {
            "started": _utcnow(),
            "dependencies_met": True,
            "engine": self.ident,
            "is_broadcast": parent_md.get("is_broadcast", False),
            "is_coalescing": parent_md.get("is_coalescing", False),
            "original_msg_id": parent_md.get("original_msg_id", ""),
            "label": parent_md.get("label"),
        }
        if kind != "apply_request":
            content = _error(NotImplementedError(f"a stand-in engine answers apply requests only, not {kind}"))
            content["engine_info"] = {"engine_uuid": self.ident, "engine_id": self.id, "method": "apply"}
            md["status"] = "error"
            self.session.send(
                self.shell, kind.replace("_request", "_reply"), content, parent=msg, ident=idents, metadata=md
            )
            return
        from ipyparallel.serialize import serialize_object, unpack_apply_message

        try:
            f, args, kwargs = unpack_apply_message(msg["buffers"], self.ns, copy=False)
            result = self.call(msg, f, args, kwargs)
            buffers = serialize_object(
                result, buffer_threshold=self.session.buffer_threshold, item_threshold=self.session.item_threshold
            )
            content = {"status": "ok"}
        except Exception as e:  # as the engine: the error goes back as the reply's content
            content, buffers = _error(e), []
            content["engine_info"] = {"engine_uuid": self.ident, "engine_id": self.id, "method": "apply"}
        md["status"] = content["status"]
        self.session.send(self.shell, "apply_reply", content, parent=msg, ident=idents, buffers=buffers, metadata=md)

    def call(self, msg: dict, f, args, kwargs):
        """What ``workbench.engine.rpc.fanned(fn, *args)`` returns on a rank, for the fanned calls."""
        from ipyparallel.error import wrap_exception
        from ipyparallel.serialize import uncan

        from workbench.engine import rpc
        from workbench.shared import replies, wire

        if not _same(f, rpc.fanned):
            raise NotImplementedError(f"a stand-in engine answers fanned calls only, not {getattr(f, '__name__', f)}")
        fn, *rest = args
        published, error, value = 0, None, None
        try:
            request = rest[0] if _same(fn, rpc.handle) and len(rest) == 1 else None
            if isinstance(request, rpc.RunCell):
                published = self.cell(msg, request.code)
                value = replies.CellRun(published=published)
            elif isinstance(request, rpc.SetNames):
                self.ns.update({k: uncan(v, self.ns) for k, v in request.namespace.items()})
            elif isinstance(request, rpc.GetName):
                try:
                    value = self.ns[request.name]
                except KeyError:
                    raise NameError(f"name '{request.name}' is not defined") from None
            else:
                what = type(request).__name__ if request is not None else getattr(fn, "__name__", fn)
                raise NotImplementedError(f"a stand-in engine does not run {what}")
        except Exception:
            error = wrap_exception()
        if published:
            self.publish(msg, "data_message", {"keys": [wire.OUTPUT_DONE]}, b"datapub", {wire.OUTPUT_DONE: True})
        return published, error, value

    def cell(self, msg: dict, code: str) -> int:
        """The cell's code in this stand-in's namespace; its printed output as one stream message
        per stream (as ipykernel's streams batch a quick cell's prints). Messages published."""
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            exec(compile(code, "<cell>", "exec"), self.ns)
        published = 0
        for name, buf in (("stdout", out), ("stderr", err)):
            if buf.getvalue():
                topic = f"engine.{self.id}.{name}".encode()
                self.publish(msg, "stream", {"name": name, "text": buf.getvalue()}, topic)
                published += 1
        return published

    def publish(self, parent: dict, kind: str, content: dict, topic: bytes, data=None) -> None:
        from ipyparallel.serialize import serialize_object

        buffers = serialize_object(data) if data is not None else None
        self.session.send(
            self.iopub, kind, content, parent=parent, ident=topic, buffers=buffers, metadata={"engine": self.ident}
        )

    def close(self) -> None:
        for sock in (self.reg, self.shell, self.control, self.iopub, self.ping, self.pong):
            if sock is not None:
                sock.close(linger=0)


def _same(f, g) -> bool:
    """The same module function: ipyparallel sends functions by value (canned), and makes a new one."""
    return getattr(f, "__module__", None) == g.__module__ and getattr(f, "__name__", None) == g.__name__


def _utcnow():
    from datetime import datetime, timezone

    return datetime.now(timezone.utc)


def _error(e: BaseException) -> dict:
    return {"status": "error", "ename": type(e).__name__, "evalue": str(e), "traceback": []}


def serve(n: int, engine_file: str) -> None:
    import zmq

    raise_fd_limit(n)
    with open(engine_file) as f:
        info = json.load(f)
    ctx = zmq.Context()
    ctx.MAX_SOCKETS = SOCKETS_PER_ENGINE * n + 64
    engines = [StandIn(i, n, ctx, info) for i in range(n)]
    sel = selectors.EpollSelector()
    # each ZMQ socket's descriptor says "its events changed" (edge-triggered): on a wake-up,
    # a socket is read for as long as it has messages (and again after a send on it)
    for e in engines:
        sel.register(e.reg.FD, selectors.EVENT_READ, (e.reg, e.registered, True))
    sel.register(sys.stdin.fileno(), selectors.EVENT_READ, None)
    print("registering", flush=True)
    for e in engines:
        e.register()
    waiting = n
    while True:
        for key, _ in sel.select():
            if key.data is None:
                for e in engines:
                    e.close()
                ctx.term()
                return
            sock, handle, once = key.data
            while sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
                handle(sock.recv_multipart(zmq.NOBLOCK))
                if once:  # a registration: its reply read, then its engine's own sockets
                    sel.unregister(sock.FD)
                    e = handle.__self__
                    sel.register(e.shell.FD, selectors.EVENT_READ, (e.shell, e.request, False))
                    sel.register(e.ping.FD, selectors.EVENT_READ, (e.ping, e.beat, False))
                    waiting -= 1
                    if not waiting:
                        print("registered", flush=True)
                    break


@contextlib.contextmanager
def standin_rankset(n: int, folder: str, *, depth: int | None = None, timeout: float = 300.0):
    """A ``RankSet`` of ``n`` SIMULATED ranks: the real notebook side in this process, the REAL
    controller (and its schedulers) started as a rank set starts it, ``n`` stand-in engines in
    one child process. ``depth``: the broadcast tree's, instead of the one chosen for ``n``.
    The set's ``registration_s``: from the first registration request to all ``n`` engines
    known to the client. Stopped on leaving (``RankSet.stop``: the stand-ins by pid, the controller)."""
    import ipyparallel as ipp

    from workbench.notebook.cluster import RankSet, RankSetConfig, launchers

    rs = RankSet(RankSetConfig(n=n, backend="gloo"))
    kwargs = launchers.cluster_kwargs("local", n)
    kwargs["profile_dir"] = os.path.join(folder, "profile")
    os.makedirs(kwargs["profile_dir"], exist_ok=True)
    if depth is not None:
        args = [a for a in kwargs["controller_args"] if not a.startswith("--IPController.broadcast_scheduler_depth=")]
        kwargs["controller_args"] = [*args, f"--IPController.broadcast_scheduler_depth={depth}"]
    proc = None
    try:
        rs.cluster = ipp.Cluster(**kwargs)
        rs.cluster.start_controller_sync()
        rs._note_controller()
        pattern = os.path.join(kwargs["profile_dir"], "security", f"ipcontroller-{rs.cluster.cluster_id}-engine.json")
        deadline = time.monotonic() + 60
        while not glob.glob(pattern):
            if time.monotonic() > deadline:
                raise TimeoutError(f"the controller wrote no {pattern} within 60 s")
            time.sleep(0.02)
        time.sleep(0.05)  # written at once, but not atomically
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), *sys.path) if p)}
        proc = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), str(n), glob.glob(pattern)[0]],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
        )
        rs.started_pids.append(proc.pid)
        rs.client = rs._connect_client()
        if proc.stdout.readline().strip() != b"registering":
            raise RuntimeError(f"the stand-in engines did not start (exit {proc.wait(10)})")
        t0 = time.perf_counter()
        rs.client.wait_for_engines(n, timeout=timeout, block=True, interactive=False)
        rs.registration_s = time.perf_counter() - t0
        rs.engine_ids = sorted(rs.client.ids)
        rs.standins = proc
        rs.broadcast_depth = launchers.broadcast_depth(n) if depth is None else depth
        yield rs
    finally:
        if proc is not None and proc.stdin is not None:
            proc.stdin.close()  # the stand-ins close their sockets and exit
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                pass
        rs.stop()


def controller_tree(rs) -> list:
    """The controller's process and every process it forked (its schedulers among them)."""
    import psutil

    root = psutil.Process(rs.cluster.controller.pid)
    return [root, *root.children(recursive=True)]


def broadcast_schedulers(rs) -> list:
    """Of :func:`controller_tree`, the broadcast tree's ``2**(depth + 1) - 1`` schedulers. The
    controller starts its forked children in one order (``IPController.start``): the IOPub, mux,
    control and task queues, the tree's schedulers, then the heart monitor."""
    import psutil

    children = psutil.Process(rs.cluster.controller.pid).children()
    children.sort(key=lambda p: (p.create_time(), p.pid))
    k = 2 ** (rs.broadcast_depth + 1) - 1
    if len(children) < k + 2:
        raise RuntimeError(f"the controller has {len(children)} children, fewer than its tree's {k} and 2 more")
    return children[-(k + 1) : -1]


def left_behind(rs) -> list[int]:
    """Pids of the set still alive after it stopped: the stand-ins' process, the controller's session."""
    import psutil

    from workbench.notebook.cluster import health

    left = [p for p in health.session_pids(*rs._controller_session)] if rs._controller_session else []
    proc = getattr(rs, "standins", None)
    if proc is not None and proc.poll() is None and psutil.pid_exists(proc.pid):
        left.append(proc.pid)
    return left


if __name__ == "__main__":
    serve(int(sys.argv[1]), sys.argv[2])
