"""What the sidebar's buttons do, done by the server itself (never through the owning kernel).

Interrupt and stacks go to the rank processes by pid (SIGINT; SIGUSR1, which every rank
answers with a faulthandler dump into the rank set's stack folder); trainer control goes to
the ranks through the rank set's ipyparallel controller; stop ends the rank and controller
pids and marks the registry entry, so the kernel's next ``%distrain`` call says what happened.
"""

from __future__ import annotations

import os
import signal
import socket
import time

from ..engine import rpc
from ..notebook import registry
from ..notebook.cluster import culprit, health
from ..notebook.cluster.diagnosis import main_frames, where

TRAINER_ACTIONS = ("pause", "resume", "stop")
ACTIONS = ("interrupt", "where", "stop") + tuple(f"trainer-{a}" for a in TRAINER_ACTIONS)


class ActionError(ValueError):
    """A request the server refuses, with what would work."""


def _local(entry: dict, r: dict) -> bool:
    return r.get("host") == socket.gethostname()


def _selected(entry: dict, ranks) -> list[dict]:
    if ranks is None:
        return list(entry["ranks"])
    known = {r["rank"]: r for r in entry["ranks"]}
    bad = [x for x in ranks if x not in known]
    if bad or not isinstance(ranks, list):
        raise ActionError(f"ranks {bad or ranks!r} are not in this rank set (0-{len(known) - 1})")
    return [known[x] for x in ranks]


def _alive(pid) -> bool:
    import psutil

    try:
        return psutil.Process(int(pid)).status() not in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD)
    except (psutil.NoSuchProcess, TypeError, ValueError):
        return False


def interrupt(monitor, entry: dict, ranks=None) -> dict:
    """SIGINT to the ranks: what the stop button does to a cell, sent from the server."""
    sent, remote = [], []
    for r in _selected(entry, ranks):
        if _local(entry, r):
            if _alive(r["pid"]):
                os.kill(int(r["pid"]), signal.SIGINT)
                sent.append(r["rank"])
        else:
            remote.append(r)
    if remote:
        eids = [r["engine_id"] for r in remote]
        monitor.controllers.call(entry, lambda c: c.send_signal(signal.SIGINT, targets=eids, block=True))
        sent += [r["rank"] for r in remote]
    return {"interrupted": sorted(sent)}


def stacks(monitor, entry: dict, ranks=None, wait: float = 2.0) -> dict:
    """rank -> where it is now (innermost frame of the cell's thread) and its frames; ``culprit``:
    the conclusion (who waits in which collective, for whom) from the ranks' flight records."""
    folder = entry["stack_dir"]
    sizes: dict[int, int] = {}
    out: dict[int, dict] = {}
    dumps: dict[int, str] = {}
    for r in _selected(entry, ranks):
        rank, pid = r["rank"], r["pid"]
        if not _local(entry, r):
            out[rank] = {"where": f"on host {r['host']}: run `%distrain where` in the notebook", "frames": []}
            continue
        if not _alive(pid):
            out[rank] = {"where": f"process {pid} is dead", "frames": []}
            continue
        import psutil

        if psutil.Process(int(pid)).status() == psutil.STATUS_STOPPED:
            out[rank] = {"where": f"process {pid} is stopped (SIGSTOP)", "frames": []}
            continue
        path = os.path.join(folder, f"rank{rank}.stack")
        sizes[rank] = os.path.getsize(path) if os.path.exists(path) else 0
        os.kill(int(pid), signal.SIGUSR1)
    deadline = time.monotonic() + wait
    while sizes and time.monotonic() < deadline:
        time.sleep(0.05)
        for rank in list(sizes):
            path = os.path.join(folder, f"rank{rank}.stack")
            if os.path.exists(path) and os.path.getsize(path) > sizes[rank]:
                time.sleep(0.05)  # let faulthandler finish writing
                with open(path) as fh:
                    fh.seek(sizes.pop(rank))
                    text = fh.read().strip()
                out[rank] = {"where": where(text), "frames": main_frames(text)[:12]}
                dumps[rank] = text
    for rank in sizes:
        out[rank] = {"where": "no stack arrived (the rank did not answer SIGUSR1 in time)", "frames": []}
    places = {rank: culprit.place_of(dumps.get(rank) or out[rank]["where"]) for rank in out}
    records = culprit.read_records(os.path.join(os.path.dirname(folder), "flight"), sorted(places))
    verdict = culprit.conclude(records, places, len(entry["ranks"]))
    return {"stacks": {str(k): out[k] for k in sorted(out)}, "culprit": verdict.text}


def trainer(monitor, entry: dict, action: str, ranks=None, timeout: float = 5.0) -> dict:
    """pause / resume / stop the ranks' trainer through the controller.

    The request (``rpc.ControlTraining``) waits behind a cell the ranks are running, so after
    ``timeout`` it is withdrawn and refused instead.
    """
    if action not in TRAINER_ACTIONS:
        raise ActionError(f"unknown trainer action {action!r}: use one of {', '.join(TRAINER_ACTIONS)}")
    eids = [r["engine_id"] for r in _selected(entry, ranks)]
    request = rpc.ControlTraining(action=action, reason="requested from the JupyterLab sidebar")

    def run(client):
        ar = client[eids].apply_async(rpc.handle, request)
        if not ar.wait(timeout):
            client.abort(ar.msg_ids)
            return None
        ar.get()
        return True

    done = monitor.controllers.call(entry, run, timeout=timeout + 5)
    if done is None:
        raise ActionError(
            f"the ranks are running a cell, so `trainer {action}` would wait behind it: "
            "interrupt the cell first, or use `%distrain train pause` in the notebook"
        )
    return {"trainer": action, "ranks": [r["rank"] for r in _selected(entry, ranks)]}


def stop(monitor, entry: dict) -> dict:
    """End the rank set: mark the entry (the kernel forgets it on its next call), end the pids."""
    registry.update(entry["id"], stopped_by=f"{registry.STOP_NOTE} at {time.strftime('%H:%M:%S')}")
    here = socket.gethostname()
    ranks = [int(r["pid"]) for r in entry["ranks"] if r.get("host") == here and r.get("pid")]
    remote = [r["engine_id"] for r in entry["ranks"] if r.get("host") != here]
    if remote:
        try:
            monitor.controllers.call(entry, lambda c: c.shutdown(targets=remote, block=True, hub=False))
        except Exception:
            pass
    monitor.controllers.forget(entry["id"])
    left = health.end_pids(health.process_tree(ranks), grace=1.0)
    left += health.end_pids(health.process_tree(entry.get("controller_pids") or []), grace=1.0)
    return {"stopped": [r["rank"] for r in entry["ranks"]], "left": left}


def run_action(monitor, entry: dict, action: str, ranks=None) -> dict:
    if action == "interrupt":
        return interrupt(monitor, entry, ranks)
    if action == "where":
        return stacks(monitor, entry, ranks)
    if action == "stop":
        return stop(monitor, entry)
    if action.startswith("trainer-"):
        return trainer(monitor, entry, action[len("trainer-") :], ranks)
    raise ActionError(f"unknown action {action!r}: use one of {', '.join(ACTIONS)}")
