"""A rank's place in a Ray cluster: the actor that holds one rank process (rank side).

``%distrain start --launcher ray`` places one actor per rank; each starts the same guarded
engine the Slurm and SSH launchers start (``workbench.engine.guard``) as its child, so every
launcher's ranks are alike, and asks it to end with the actor (``PR_SET_PDEATHSIG``): a
killed actor or a dead node takes its rank along. Plain standard library besides Ray."""

from __future__ import annotations

import ctypes
import os
import signal
import socket
import subprocess
import sys

from ..shared.wire import ENV_HOST_SLOT

_PR_SET_PDEATHSIG = 1


def _end_with_parent() -> None:
    """In the child before exec: SIGTERM when the actor's process (its parent) is gone."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except (OSError, AttributeError):  # not Linux: the lifeline still ends the rank
        pass


class RankHost:
    """Starts ``cmd`` (the guarded engine) with ``env`` added, and answers for it.

    ``{python}`` in ``cmd`` is this worker's interpreter: each node runs its own.
    """

    def __init__(self, cmd: list[str], env: dict[str, str]):
        cmd = [sys.executable if part == "{python}" else part for part in cmd]
        # the engine's profile folder and the rank's own log, on this node's disk
        profile = env.get("IPP_PROFILE_DIR") or os.getcwd()
        os.makedirs(os.path.join(profile, "log"), exist_ok=True)
        self.log = os.path.join(profile, "log", f"rank-slot{env.get(ENV_HOST_SLOT, '')}-{os.getpid()}.log")
        with open(self.log, "ab") as out:
            # the thread that forks is the one whose end PDEATHSIG watches: Ray runs an actor's
            # constructor on the worker's main thread, which lives as long as the actor
            self.proc = subprocess.Popen(
                cmd, env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, preexec_fn=_end_with_parent
            )

    def where(self) -> dict:
        """Host, this actor's pid, the guard's pid and the Ray node it was placed on."""
        import ray

        ctx = ray.get_runtime_context()
        return {
            "host": socket.gethostname(),
            "actor_pid": os.getpid(),
            "guard_pid": self.proc.pid,
            "node_id": ctx.get_node_id(),
            "node_ip": ray.util.get_node_ip_address(),
        }

    def wait(self) -> dict:
        """Block until the rank process ends: its exit status (the guard reports it too) and
        the end of its output (why it ended before registering, say)."""
        code = self.proc.wait()
        try:
            with open(self.log, errors="replace") as f:
                tail = f.read()[-2000:]
        except OSError:
            tail = ""
        return {"code": code, "output": tail, "log": self.log}

    def end(self, grace: float = 2.0) -> int | None:
        """End the rank process (the guard passes SIGTERM on to its engine)."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode
