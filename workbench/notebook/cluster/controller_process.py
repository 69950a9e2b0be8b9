"""The controller's process: ipyparallel's controller, which ends when its notebook does.

ipyparallel starts the controller in a session of its own, so a killed notebook kernel
(SIGKILL, out of memory) does not take it along. Ranks on the notebook's host end it then
(rank 0 watches the notebook), but Slurm and SSH ranks run elsewhere and their guards end
them first: the controller and the schedulers it forked would live on. So the controller
watches its parent itself and, once the notebook is gone, ends its own process group
(itself and its schedulers, nothing else: it leads that group).

Run by path (``runpy.run_path``), not as ``-m workbench...``: the controller imports nothing
of the workbench, so it starts as fast as ipyparallel's own and needs no import path.
Standard library and psutil only.
"""

from __future__ import annotations

import os
import signal
import threading
import time

POLL_S = 0.5


def _end_when_orphaned(parent: int) -> None:
    while os.getppid() == parent:
        time.sleep(POLL_S)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)  # the group this process leads: it and its schedulers
    import psutil  # not a group leader (started some other way): its children by pid, then itself

    for child in psutil.Process().children(recursive=True):
        try:
            child.kill()
        except psutil.Error:
            pass
    os._exit(1)


def main() -> None:
    threading.Thread(target=_end_when_orphaned, args=(os.getppid(),), name="owner-watch", daemon=True).start()
    from ipyparallel.controller.app import main as controller

    controller()


if __name__ == "__main__":
    main()
