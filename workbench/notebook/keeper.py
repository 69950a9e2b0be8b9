"""The keeper of a detached rank set: ``python -m workbench.notebook.keeper`` (started by ``detach``).

A small notebook-side process that outlives the kernel and holds the set as the kernel did
(:mod:`.handoff`): its ranks end with it, it reads their stream into the session's store and
watches the session's run. Its registry entry (``"detached": true``, ``keeper_pid``) is the
set's owner file; its Unix socket, keyed in that 0600 entry, takes ``handover`` and ``stop``.
Protocol with the kernel that detaches: one JSON line out, the pickled session in, the entry out."""

from __future__ import annotations

import argparse
import json
import os
import pickle
import secrets
import sys
import tempfile
import threading
import time

ENTRY_POLL_S = 1.0  # how often the keeper looks for a stop from the Lab sidebar


class Keeper:
    def __init__(self, sess):
        from multiprocessing.connection import Listener

        self.sess = sess
        self.key = secrets.token_bytes(32)
        self.path = _socket_path()
        self.listener = Listener(self.path, family="AF_UNIX", authkey=self.key)
        os.chmod(self.path, 0o600)
        self.lock = threading.Lock()  # one request at a time (a sidebar stop and an attach)
        self.done = threading.Event()

    def control(self) -> dict:
        return {"address": self.path, "key": self.key.hex()}

    def mark(self, rs=None) -> dict | None:
        """Make the registry entry of the set this keeper holds its owner file. Called again for
        the new set a failure budget's recovery starts here (its entry is a new one)."""
        from . import registry

        entry_id = registry.entry_id_of(rs or self.sess.rankset)
        if entry_id is None:
            return None
        return registry.update(
            entry_id,
            detached=True,
            name=self.sess.name,
            keeper_pid=os.getpid(),
            control=self.control(),
            detached_at=time.time(),
        )

    def serve(self) -> None:
        threading.Thread(target=self._watch_entry, name="keeper-entry", daemon=True).start()
        while not self.done.is_set():
            try:
                conn = self.listener.accept()
            except OSError:  # a client that failed the key, or the listener closed at the end
                if self.done.is_set():
                    break
                continue
            with conn:
                try:
                    request = conn.recv()
                except (EOFError, OSError):
                    continue
                try:
                    reply = self.handle(request)
                except Exception as exc:
                    reply = {"error": f"the keeper could not {request.get('op')}: {type(exc).__name__}: {exc}"}
                try:
                    conn.send(reply)
                except OSError:
                    pass
        self.close()

    def handle(self, request: dict):
        from . import handoff

        op = request.get("op")
        with self.lock:
            if self.done.is_set():
                return {"error": "the set has just been stopped or attached elsewhere"}
            if op == "handover":
                state = handoff.give(self.sess, int(request["pid"]), request["address"], bytes.fromhex(request["key"]))
                self.done.set()
                return state
            if op == "stop":
                left = self.stop()
                return {"left": left}
            if op == "info":
                rs = self.sess.rankset
                return {"name": self.sess.name, "running": self.sess.running, "world_size": rs.world_size if rs else 0}
        return {"error": f"unknown request {op!r}"}

    def stop(self) -> list[int]:
        from . import api

        run = self.sess.runs.current
        if run is not None:
            run.close()
        owner = self.sess.rankset.owner_file() if self.sess.rankset is not None else None
        left = api.stop(self.sess.name)
        if owner:
            try:
                os.unlink(owner)
            except OSError:
                pass
        self.done.set()
        return left

    def _watch_entry(self) -> None:
        """The Lab sidebar's stop marks the entry (and ends the pids): stop the rest and go."""
        from . import registry

        while not self.done.wait(ENTRY_POLL_S):
            rs = self.sess.rankset
            entry_id = registry.entry_id_of(rs) if rs is not None else None
            entry = registry.read(entry_id) if entry_id is not None else None  # None: a recovery's restart
            if entry is not None and entry.get("stopped_by"):
                with self.lock:
                    if not self.done.is_set():
                        self.stop()
                self._wake()
                return

    def _wake(self) -> None:
        from multiprocessing.connection import Client

        try:  # the accept loop is waiting: one connection lets it see done
            Client(self.path, family="AF_UNIX", authkey=self.key).close()
        except OSError:
            pass

    def close(self) -> None:
        try:
            self.listener.close()
        except OSError:
            pass
        try:
            os.unlink(self.path)
        except OSError:
            pass


def _socket_path() -> str:
    """Beside the registry entries (Jupyter's runtime folder, this user's), unless that path is too
    long for a Unix socket (108 bytes on Linux): then the temporary folder."""
    from . import registry

    name = f"keeper-{os.getpid()}-{secrets.token_hex(4)}.sock"
    path = os.path.join(registry.folder(), name)
    if len(path.encode()) < 100:
        os.makedirs(registry.folder(), mode=0o700, exist_ok=True)
        return path
    return os.path.join(tempfile.gettempdir(), "distrain-" + name)


def main(argv: list[str] | None = None) -> None:
    from . import api, handoff
    from .stream.collector import Collector

    parser = argparse.ArgumentParser(prog="python -m workbench.notebook.keeper")
    parser.add_argument("--log", required=True, help="where this process writes what it prints")
    args = parser.parse_args(argv)
    # the pipe to the kernel is this process's alone (a duplicate: not inherited), and fd 1 is the
    # log from the start, so nothing a tracker starts here (W&B's service) holds that pipe and
    # dies with it once the kernel is gone
    out = os.fdopen(os.dup(1), "w")
    log = os.open(args.log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    os.dup2(log, 1)
    os.close(log)
    sys.stdout = os.fdopen(os.dup(1), "w", buffering=1)  # what it prints (a recovery's lines)
    key = secrets.token_bytes(32)
    collector = Collector(key=key, paused=True)
    out.write(json.dumps({"address": collector.address, "key": key.hex(), "pid": os.getpid()}) + "\n")
    out.flush()
    state = pickle.load(sys.stdin.buffer)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sess = handoff.take(state, collector)
    keeper = Keeper(sess)
    entry = keeper.mark()
    api.on("started", keeper.mark)  # after the registry's own listener has written the new entry
    out.write(json.dumps(entry) + "\n")
    out.flush()
    out.close()
    keeper.serve()
    sys.stdout.flush()
    os._exit(0)  # the set is the kernel's or stopped: nothing here to tidy (api's atexit would stop it)


if __name__ == "__main__":
    main()
