"""``%distrain detach`` / ``attach`` / ``stop --session`` of a detached set: a session moved between processes.

A keeper process (:mod:`.keeper`) holds a detached set past its kernel; ``attach`` takes it back.
Either way the giver re-points the ranks' watch and event stream at the taker, reads what was
still on its way, and sends the session part by part as each owner packs it (:func:`give`); the
taker rebuilds the set on its own client and watches the run on (:func:`take`). A run on the
ranks never notices: its trainer emits into a queue the whole time, and no event moves twice or
nowhere."""

from __future__ import annotations

import os
import pickle
import secrets
import subprocess
import sys
import time

from ..shared.errors import NotRunning, WorkbenchError
from . import api, registry, session
from .keywords import refuse
from .session import KERNEL, Session

HANDOFF_TIMEOUT_S = 900.0  # a keeper finishing a recovery before it hands the set over
_KEEPERS: dict[int, subprocess.Popen] = {}  # keepers this process started: reaped when they end


class DetachError(WorkbenchError):
    """A set that cannot be detached, attached or stopped as asked; nothing was changed."""


# ------------------------------------------------------------------ the session in transit
def _packed_setup(setup):
    """A recovery's setup as it travels: the code itself, a function pickled by value
    (cloudpickle: a notebook's function has no module to import it from), or None (none, or the
    recorded ``workbench.train.setup(...)``'s own, which the recipe repeats). Raises :class:`DetachError`."""
    if setup is None or isinstance(setup, str) or getattr(setup, "from_recipe", False):
        return setup if isinstance(setup, str) else None
    instead = (
        "pass the setup as code instead (a string run on every rank: `train start --max-failures K --setup VAR` "
        "with VAR holding the code, or `workbench.train.start(..., setup=code)`)"
    )
    try:
        import cloudpickle
    except ImportError:
        raise DetachError(
            f"the recovery setup is a function ({_name_of(setup)}) and carrying a function to the keeper "
            f"needs the cloudpickle package, which is not installed: pip install cloudpickle, or {instead}; "
            "nothing was changed"
        ) from None
    try:
        packed = cloudpickle.dumps(setup)
        cloudpickle.loads(packed)
    except Exception as exc:
        raise DetachError(
            f"the recovery setup {_name_of(setup)} cannot be carried to the keeper: pickling it failed with "
            f"{type(exc).__name__}: {exc} (it refers to something that lives only in this process, such as a "
            f"rank set or an open file); {instead}; nothing was changed"
        ) from None
    return packed


def _name_of(fn) -> str:
    return f"{getattr(fn, '__qualname__', type(fn).__name__)}()"


def _unpacked_setup(packed, notes: list[str]):
    if not isinstance(packed, bytes):
        return packed
    try:
        import cloudpickle

        return cloudpickle.loads(packed)
    except Exception as exc:
        notes.append(
            f"the recovery setup (a function) could not be loaded in this process: {type(exc).__name__}: {exc}; "
            "a recovery repeats the recorded workbench.train.setup(...) if there is one"
        )
        return None


def give(sess, pid: int, address: str, key: bytes) -> dict:
    """Hand ``sess``'s running set to process ``pid``, whose collector listens at ``address``;
    returns the session's state for it. This process holds the set no more afterwards."""
    from ..engine import rpc
    from . import checkpoints, runs, setup_recipe, stream
    from .cluster import adoption

    _packed_setup(sess.setup.given)  # refused here: nothing was changed yet
    run = runs.carry(sess)  # a recovery under way finishes first: the set it starts is the one handed over
    rs = sess.rankset
    if rs is None or not rs.running:
        raise NotRunning(f"the rank set {sess.name!r} is not running (its recovery failed): nothing to hand over")
    adoption.rehome(rs, pid)
    live = [r for r in range(rs.world_size) if r not in rs.watcher.known()]
    if live:
        rs.apply(rpc.handle, rpc.ConnectStream(address, key), ranks=live, timeout=30)
    stream.drain(sess)
    store = sess.store
    carried = []
    if sess.trackers.by_kind:
        from . import trackers

        carried = trackers.carry(sess)  # every row the old stream took was offered to them first
    for fn in session.KERNEL.listeners["stopping"]:  # dashboard, trackers, stream, registry entry
        try:
            fn(rs)
        except Exception:
            pass
    state = {
        "name": sess.name,
        "rankset": adoption.export(rs),
        "store": store,
        "setup": setup_recipe.carry(sess, _packed_setup),
        "checkpoints": checkpoints.carry(sess),
        "run": run,
        "trackers": carried,
    }
    adoption.release(rs)
    api.let_go(sess)
    return state


def take(state: dict, collector) -> session.Session:
    """Hold the set ``state`` describes in this process, reading its stream with ``collector``."""
    from . import checkpoints, runs, setup_recipe, stream
    from .cluster import adoption

    rs = adoption.adopt(state["rankset"])
    sess = session.KERNEL.add(state["name"])
    notes: list[str] = []
    setup_recipe.take(sess, state["setup"], lambda packed: _unpacked_setup(packed, notes))
    checkpoints.take(sess, state["checkpoints"])
    store = state["store"] if state["store"] is not None else stream.new_store(sess)
    api.hold(sess, rs)
    stream.take(sess, collector, rs, store)
    if state.get("trackers"):
        from . import trackers

        notes += trackers.resume(sess, state["trackers"])  # before the store takes a new row
    sess.handoff.notes = notes
    for note in notes:
        print(note)  # the keeper's log, or the attaching kernel
    collector.begin(store)
    registry.announce(rs)
    runs.take(sess, state["run"])
    return sess


# ------------------------------------------------------------------ owner files (the keepers' entries)
def detached_sets() -> dict[str, dict]:
    """The detached sets of this user on this host, by name (their keepers' registry entries)."""
    out = {}
    for entry in registry.read_all():
        if entry.get("detached") and not entry.get("stale"):
            out[entry["name"]] = entry
    return out


def _listing(sets: dict[str, dict]) -> str:
    if not sets:
        return "there are no detached sets (`%distrain detach` makes one)"
    return "the detached sets are: " + ", ".join(
        f"{n} ({e.get('world_size')} ranks, keeper pid {e.get('keeper_pid')})" for n, e in sorted(sets.items())
    )


def _entry(name: str) -> dict:
    sets = detached_sets()
    if name not in sets:
        raise DetachError(f"there is no detached rank set named {name!r}; {_listing(sets)}")
    return sets[name]


def _call(entry: dict, request: dict, timeout: float = HANDOFF_TIMEOUT_S):
    from multiprocessing.connection import Client

    ctl = entry["control"]
    try:
        conn = Client(ctl["address"], family="AF_UNIX", authkey=bytes.fromhex(ctl["key"]))
    except OSError as exc:
        raise DetachError(
            f"the keeper of {entry['name']!r} (pid {entry.get('keeper_pid')}) does not answer: {exc}"
        ) from None
    with conn:
        conn.send(request)
        if not conn.poll(timeout):
            raise DetachError(f"the keeper of {entry['name']!r} did not answer within {timeout:.0f} s")
        reply = conn.recv()
    if isinstance(reply, dict) and reply.get("error"):
        raise DetachError(reply["error"])
    return reply


# ------------------------------------------------------------------ the API behind the magics
def detach(session: str | None = None, **earlier) -> dict:
    """Hand the session named ``session`` (default: the current one) to a keeper process that outlives
    this kernel; returns its owner entry. A run started with ``train start`` keeps training."""
    refuse("workbench.detach", earlier, {"name": "session"})
    name = session
    sess = api.session(name) if name is not None else KERNEL.current()
    if sess is None or not sess.running:
        raise NotRunning(
            f"the rank set {sess.name!r} is not running: there is nothing to detach"
            if sess is not None
            else "no ranks are running: there is nothing to detach (`%distrain start -n 2 --session NAME`)"
        )
    from .cluster import adoption

    rs = sess.rankset
    why = adoption.refusal(rs)
    if why:
        raise DetachError(f"{why}; nothing was changed")
    taken = detached_sets()
    if sess.name in taken:
        raise DetachError(
            f"a detached set is already named {sess.name!r}: stop it (`%distrain stop --session {sess.name}`) "
            "or attach it first; nothing was changed"
        )
    busy = _busy_ranks(rs)
    if busy:
        from ..shared.ranges import format_ranks

        raise DetachError(
            f"ranks {format_ranks(busy)} of {sess.name!r} are running a cell: wait for it (or interrupt it) "
            "and detach again; a run started with `train start` goes on while detached. Nothing was changed"
        )
    _packed_setup(sess.setup.given)  # a setup function that cannot travel is refused before the keeper starts
    from . import runs

    why = runs.carry_refusal(sess)
    if why:
        raise DetachError(f"{why}; nothing was changed")
    return _start_keeper(sess)


BUSY_SETTLE_S = 1.0


def _busy_ranks(rs) -> list[int]:
    """Ranks with a cell or call in their queue (a training run's thread is not one).

    The controller counts a request done when its copy of the reply comes in, which can be after
    this notebook already has the reply itself: with no request of this notebook awaiting a reply,
    a rank it calls busy is asked about again for up to :data:`BUSY_SETTLE_S` before it counts."""
    deadline = time.monotonic() + BUSY_SETTLE_S
    while True:
        queues = rs.client.queue_status(verbose=False)
        busy = [
            r
            for r, eid in enumerate(rs.engine_ids)
            if (queues.get(eid, {}).get("queue", 0) or queues.get(eid, {}).get("tasks", 0))
        ]
        if not busy or rs.client.outstanding or time.monotonic() >= deadline:
            return busy
        time.sleep(0.05)


def _start_keeper(sess) -> dict:
    import json

    log_dir = os.path.join(sess.rankset.state_dir(), "keeper")
    os.makedirs(log_dir, exist_ok=True)
    log = open(os.path.join(log_dir, "keeper.log"), "ab")  # noqa: SIM115 - the keeper's, closed below
    proc = subprocess.Popen(
        [sys.executable, "-m", "workbench.notebook.keeper", "--log", log.name],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=log,
        start_new_session=True,  # no signal to the kernel's group (a Jupyter restart) reaches it
        env=_keeper_env(),
    )
    log.close()
    _KEEPERS[proc.pid] = proc
    try:
        ready = proc.stdout.readline()
        if not ready:
            raise DetachError(f"the keeper process ended before it was ready (exit {proc.wait()}); see {log_dir}")
        hello = json.loads(ready)
        state = give(sess, proc.pid, hello["address"], bytes.fromhex(hello["key"]))
        pickle.dump(state, proc.stdin, protocol=pickle.HIGHEST_PROTOCOL)
        proc.stdin.close()
        done = proc.stdout.readline()
    except BaseException:
        if proc.poll() is None:
            proc.kill()  # a set already pointed at it ends with it: never an orphan
            proc.wait()
        raise
    if not done:
        raise DetachError(f"the keeper process ended while taking the set over (exit {proc.wait()}); see {log_dir}")
    entry = json.loads(done)
    proc.stdout.close()
    return entry


def _keeper_env() -> dict:
    """This process's environment, less what points at services of this process: W&B's service
    (``WANDB_SERVICE``, set by a tracker here) ends with the kernel, so the keeper starts its own."""
    env = {k: v for k, v in os.environ.items() if k != "WANDB_SERVICE"}
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


def attach(session: str | None = None, **earlier) -> Session:
    """Take the detached session named ``session`` back into this process: its ranks, whole metrics
    history, failure budget and controls; it is then this kernel's set again (ends with it)."""
    from .stream.collector import Collector

    refuse("workbench.attach", earlier, {"name": "session"})
    if session is None:
        raise TypeError("workbench.attach(session=NAME): name the detached session (workbench.detached() lists them)")
    name = session
    existing = KERNEL.by_name.get(name)
    if existing is not None and existing.running:
        raise DetachError(
            f"this kernel already has a running set named {name!r}: stop it or detach it first; nothing was changed"
        )
    entry = _entry(name)
    key = secrets.token_bytes(32)
    collector = Collector(key=key, paused=True)
    try:
        state = _call(entry, {"op": "handover", "pid": os.getpid(), "address": collector.address, "key": key.hex()})
    except BaseException:
        collector.close()
        raise
    _wait_gone(entry.get("keeper_pid"), 10.0)
    return take(state, collector)


def stop(name: str) -> list[int]:
    """End the detached set ``name`` from any process: its ranks, controller and keeper; returns
    pids still alive afterwards (normally none)."""
    entry = _entry(name)
    reply = _call(entry, {"op": "stop"})
    left = list(reply.get("left") or [])
    if not _wait_gone(entry.get("keeper_pid"), 10.0):
        left.append(entry["keeper_pid"])
    return left


def _wait_gone(pid, timeout: float) -> bool:
    import psutil

    if not pid:
        return True
    own = _KEEPERS.get(int(pid))
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if own is not None and own.poll() is not None:
            _KEEPERS.pop(int(pid), None)
            return True
        try:
            if psutil.Process(int(pid)).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.05)
    return False
