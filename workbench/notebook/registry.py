"""Where the JupyterLab extension finds the rank sets this user's kernels started (notebook side).

Each rank set a kernel starts writes one small JSON entry under Jupyter's runtime directory
(``<runtime>/workbench-ranks/<id>.json``, mode 0600, removed at stop; :func:`entry_for` says what
it holds). The Jupyter server extension (:mod:`workbench.labserver`) reads these entries, so it
can show and act on ranks while the owning kernel is busy. An entry whose kernel process is gone
is stale: it is reported as such and cleaned. Never imports torch.
"""

from __future__ import annotations

import json
import os
import re
import socket
import tempfile
import threading
import time

VERSION = 1
FOLDER = "workbench-ranks"
STOP_NOTE = "stopped from the JupyterLab ranks sidebar"

_lock = threading.Lock()
_entries: dict[int, str] = {}  # id(rankset) -> entry id written by this kernel
_own_paths: dict[str, str] = {}  # entry id -> its file (this kernel's entries)
_own_seen: dict[str, tuple] = {}  # entry id -> (file stamp, stopped_by) last read


def folder() -> str:
    from jupyter_core.paths import jupyter_runtime_dir

    return os.path.join(jupyter_runtime_dir(), FOLDER)


def path_of(entry_id: str) -> str:
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", entry_id or ""):
        raise ValueError(f"not a rank set id: {entry_id!r} (letters, digits, '.', '_', '-')")
    return os.path.join(folder(), f"{entry_id}.json")


def write(entry: dict) -> str:
    """Write ``entry`` whole (never a half-written file for a reader), readable by this user only."""
    os.makedirs(folder(), mode=0o700, exist_ok=True)
    path = path_of(entry["id"])
    fd, tmp = tempfile.mkstemp(dir=folder(), prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(entry, fh, indent=1)
        os.chmod(tmp, 0o600)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    return path


def read(entry_id: str) -> dict | None:
    entry = _load(entry_id)
    if entry is not None:
        entry["stale"] = is_stale(entry)
    return entry


def _load(entry_id: str) -> dict | None:
    try:
        with open(path_of(entry_id)) as fh:
            return json.load(fh)
    except (OSError, ValueError):
        return None


def read_all() -> list[dict]:
    """Every entry, oldest first, each with ``stale`` set (its kernel process is gone)."""
    out = []
    try:
        names = sorted(os.listdir(folder()))
    except OSError:
        return []
    for name in names:
        if name.startswith(".") or not name.endswith(".json"):
            continue
        entry = read(name[:-5])
        if entry is not None and entry.get("version") == VERSION:
            out.append(entry)
    return sorted(out, key=lambda e: e.get("started", 0))


def is_stale(entry: dict) -> bool:
    """The kernel that wrote ``entry`` has exited (its pid is gone or now another process)."""
    import psutil

    pid, born = entry.get("kernel_pid"), entry.get("kernel_started")
    if entry.get("host") not in (None, socket.gethostname()):
        return False  # a kernel on another host: cannot be checked from here
    try:
        proc = psutil.Process(int(pid))
        if proc.status() == psutil.STATUS_ZOMBIE:
            return True
        return born is not None and abs(proc.create_time() - born) > 1.0
    except (psutil.NoSuchProcess, TypeError, ValueError):
        return True


def remove(entry_id: str) -> bool:
    try:
        os.unlink(path_of(entry_id))
        return True
    except FileNotFoundError:
        return False


def clean() -> list[dict]:
    """Remove every stale entry; return what was removed."""
    gone = [e for e in read_all() if e["stale"]]
    for e in gone:
        remove(e["id"])
    return gone


def update(entry_id: str, **fields) -> dict | None:
    """Read-modify-write one entry (the kernel's watcher thread and the server both update)."""
    with _lock:
        entry = read(entry_id)
        if entry is None:
            return None
        entry.pop("stale", None)
        entry.update(fields)
        write(entry)
        return entry


# ---------------------------------------------------------------- the kernel's side
def _kernel_id() -> str | None:
    """The Jupyter kernel id of this process (from its connection file), if it is a kernel."""
    try:
        from ipykernel.connect import get_connection_file

        name = os.path.basename(get_connection_file())
    except Exception:
        return None
    m = re.fullmatch(r"kernel-(.+)\.json", name)
    return m.group(1) if m else None


def entry_for(rankset, *, stream_address: str | None = None, stream_key: str | None = None) -> dict:
    """The registry entry describing ``rankset`` (plain JSON data): the kernel, the notebook, ranks
    with host/pid/device, ipyparallel's client connection file, the stack folder and the address
    and key of the event-stream mirror."""
    import psutil

    cluster = rankset.cluster
    cid = getattr(cluster, "cluster_id", "") or "default"
    profile_dir = getattr(cluster, "profile_dir", "") or ""
    conn = os.path.join(profile_dir, "security", f"ipcontroller-{cid}-client.json") if cid else ""
    ranks = []
    for rank, eid in enumerate(rankset.engine_ids):
        info = rankset.info[rank] if rank < len(rankset.info) else {}
        proc = rankset.procs[rank] if rank < len(rankset.procs) else None
        ranks.append(
            {
                "rank": rank,
                "engine_id": eid,
                "host": info.get("host", proc.host if proc else "?"),
                "pid": info.get("pid", proc.pid if proc else None),
                "device": info.get("device", "?"),
            }
        )
    return {
        "version": VERSION,
        "id": f"{os.getpid()}-{re.sub(r'[^A-Za-z0-9_.-]', '_', cid)}",
        "host": socket.gethostname(),
        "kernel_id": _kernel_id(),
        "kernel_pid": os.getpid(),
        "kernel_started": psutil.Process().create_time(),
        "notebook": os.environ.get("JPY_SESSION_NAME"),
        "cwd": os.getcwd(),
        "started": time.time(),
        "launcher": rankset.config.launcher,
        "backend": (rankset.info[0].get("backend") if rankset.info else None) or rankset.config.backend,
        "world_size": rankset.world_size,
        "ranks": ranks,
        "controller_pids": rankset._controller_pids(),
        "connection_file": conn,
        "stack_dir": os.path.join(rankset.state_dir(), "stacks"),
        "stream": {"address": stream_address, "server_key": stream_key} if stream_address else None,
        "job_id": getattr(rankset, "job_id", None),
        "deaths": {},
        "stopped_by": None,
    }


def queue_fields(job_state) -> dict:
    """What the sidebar shows of a Slurm job that waits: its id, Slurm's state and reason, nodes."""
    return {
        "job_id": job_state.job_id,
        "state": job_state.state,
        "reason": job_state.reason,
        "nodes": list(job_state.nodes),
        "time": time.time(),
    }


def queued(rankset, job_state) -> str:
    """Write (or refresh) the entry of a rank set whose Slurm job waits for its allocation.

    It has ``queue`` (job id, Slurm's reason) and ranks with no host or pid yet; ``announce``
    replaces the entry (same id) once they are up.
    """
    entry = entry_for(rankset)
    entry["world_size"] = rankset.config.n
    entry["ranks"] = [
        {"rank": i, "engine_id": None, "host": None, "pid": None, "device": None} for i in range(rankset.config.n)
    ]
    entry["queue"] = queue_fields(job_state)
    with _lock:
        known = _entries.get(id(rankset))
    if known is not None and known == entry["id"]:
        before = read(known)
        if before is not None:
            entry["started"] = before.get("started", entry["started"])
    write(entry)
    with _lock:
        _entries[id(rankset)] = entry["id"]
    return entry["id"]


def announce(rankset) -> str | None:
    """Write the entry of a started rank set, with an event-stream mirror for the server."""
    from . import stream
    from .stream.mirror import Mirror

    address = key = None
    try:
        collector = stream.attach(rankset)
        if getattr(collector, "mirror", None) is None:
            collector.mirror = Mirror()
        address, key = collector.mirror.address, collector.mirror.public_key
    except Exception:  # no stream: the sidebar still lists and controls the ranks
        pass
    entry = entry_for(rankset, stream_address=address, stream_key=key)
    write(entry)
    with _lock:
        _entries[id(rankset)] = entry["id"]
    if rankset.watcher is not None:
        rankset.watcher.listeners.append(lambda death, eid=entry["id"]: _record_death(eid, death))
        for death in rankset.watcher.deaths.values():
            _record_death(entry["id"], death)
    return entry["id"]


def _record_death(entry_id: str, death: dict) -> None:
    """Called on the kernel's watcher thread the moment a rank dies: the server shows its exit."""
    entry = read(entry_id)
    if entry is None:
        return
    deaths = dict(entry.get("deaths") or {})
    deaths[str(death["rank"])] = {k: death[k] for k in ("exit", "exit_code", "time") if k in death}
    update(entry_id, deaths=deaths)


def ranks_replaced(rankset, ranks: list[int]) -> None:
    """Some ranks of a running set were replaced (a fault-tolerant run's lost replica): their new
    pids and engines, their deaths cleared (the new watcher goes on telling later ones)."""
    entry_id = entry_id_of(rankset)
    entry = read(entry_id) if entry_id is not None else None
    if entry is None:
        return
    deaths = {k: v for k, v in (entry.get("deaths") or {}).items() if int(k) not in ranks}
    update(entry_id, ranks=entry_for(rankset)["ranks"], deaths=deaths)


def note_run(rankset, run: dict | None) -> None:
    """The session's current run changed (``notebook.runs``): its id, kind, state and head line."""
    entry_id = entry_id_of(rankset) if rankset is not None else None
    if entry_id is not None:
        update(entry_id, run=run)


def entry_id_of(rankset) -> str | None:
    with _lock:
        return _entries.get(id(rankset))


def withdraw(rankset) -> None:
    """Remove the entry of a rank set that is stopping."""
    with _lock:
        entry_id = _entries.pop(id(rankset), None)
    if entry_id is not None:
        _own_paths.pop(entry_id, None)
        _own_seen.pop(entry_id, None)
        remove(entry_id)


def stopped_elsewhere(rankset) -> str | None:
    """Why ``rankset`` was stopped outside this kernel (the sidebar's stop), or None."""
    entry_id = entry_id_of(rankset)
    if entry_id is None:
        return None
    # asked before every cell: the entry is read again only when its file changed (a stat,
    # not the runtime folder's look-up and a JSON read on every cell)
    path = _own_paths.get(entry_id) or _own_paths.setdefault(entry_id, path_of(entry_id))
    try:
        st = os.stat(path)
        stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
    except OSError:
        stamp = None
    seen = _own_seen.get(entry_id)
    if seen is not None and stamp is not None and seen[0] == stamp:
        return seen[1]
    entry = _load(entry_id)  # this kernel's own entry: not stale while it runs this
    why = entry.get("stopped_by") if entry else None
    _own_seen[entry_id] = (stamp, why)
    return why


def _on_started(rankset) -> None:
    try:
        announce(rankset)
    except Exception:  # the sidebar is a convenience: never fail a start over it
        pass


def _on_queued(rankset, job_state) -> None:
    try:
        queued(rankset, job_state)
    except Exception:
        pass


def _register() -> None:
    from . import api

    api.on("started", _on_started)
    api.on("stopping", withdraw)
    api.on("abandoned", withdraw)
    api.on("queued", _on_queued)
    api.on("check", stopped_elsewhere)


_register()
