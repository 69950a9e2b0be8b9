"""Tier 4: a notebook kernel that loads the extension starts the ranks' forking parent at once
(a standby with torch imported); the first local start forks its ranks from it, any world size;
other launchers leave it waiting; ``WORKBENCH_PRELOAD=0`` starts none. (Its end with a killed
kernel: tests/ranks/test_orphans.py.)"""

import os

import psutil
from kernel_runs import execute, printed
from kernel_runs import kernel as new_kernel

from workbench.notebook.cluster import standby

STANDBY_PID = (
    "from workbench.notebook.cluster import standby as _sb\nprint('STANDBY', _sb.current() and _sb.current().pid)"
)
RANKS = (
    "from workbench.notebook import api as _api\n_rs = _api.current()\n"
    "print('RANKS', _rs.preloaded, _rs.forked and _rs.forked.pid, *[r['pid'] for r in _rs.status()])"
)


def _run(kc, code: str) -> str:
    reply, msgs = execute(kc, code)
    assert reply["status"] == "ok", printed(msgs)
    return printed(msgs)


def _line(text: str, tag: str) -> list[str]:
    return next(line.split()[1:] for line in text.splitlines() if line.startswith(tag + " "))


def _parents(pids) -> set[int]:
    return {psutil.Process(int(p)).ppid() for p in pids}


def test_first_local_start_forks_from_the_standby_and_mpi_leaves_it_waiting():
    with new_kernel() as (_, kc):
        _run(kc, "%load_ext workbench")
        (pid,) = _line(_run(kc, STANDBY_PID), "STANDBY")
        standby_pid = int(pid)
        assert psutil.Process(standby_pid).cmdline()[-4:] == [
            "--framework",
            "torch",
            "--standby-of",
            str(_kernel_pid(kc)),
        ]

        # another launcher: its own engines; the standby stays for a later local start
        _run(kc, "%distrain start -n 2 --backend gloo --threads 1 --launcher mpi")
        preloaded, forked, *ranks = _line(_run(kc, RANKS), "RANKS")
        assert (preloaded, forked, len(ranks)) == ("False", "None", 2)
        assert standby_pid not in _parents(ranks)
        assert _line(_run(kc, STANDBY_PID), "STANDBY") == [str(standby_pid)]
        _run(kc, "%distrain stop")

        # the local start, at a world size of its own choosing: forked from the standby
        out = _run(kc, "%distrain start -n 3 --backend gloo --threads 1")
        assert "3 ranks up" in out
        preloaded, forked, *ranks = _line(_run(kc, RANKS), "RANKS")
        assert (preloaded, forked, len(ranks)) == ("True", str(standby_pid), 3)
        assert _parents(ranks) == {standby_pid}
        assert _line(_run(kc, STANDBY_PID), "STANDBY") == ["None"]  # used once, not kept beside the ranks
        assert _run(kc, "%%distrain\nimport torch.distributed as dist\nprint(dist.get_world_size())").count("3") >= 3


def test_preload_off_starts_no_process():
    os.environ[standby.ENV] = "0"
    try:
        with new_kernel() as (km, kc):
            _run(kc, "%load_ext workbench")
            assert _line(_run(kc, STANDBY_PID), "STANDBY") == ["None"]
            kernel_proc = psutil.Process(_kernel_pid(kc))
            assert not [p for p in kernel_proc.children(recursive=True) if "workbench.engine.preload" in p.cmdline()]
    finally:
        del os.environ[standby.ENV]


def test_a_standby_that_no_longer_fits_is_ended_not_used(monkeypatch):
    """The ranks would inherit the standby's environment and working directory: a kernel that
    changed either after loading the extension gets a fresh forking parent, and the standby ends."""
    fr = standby.begin()
    assert fr is not None and standby.current() is fr
    monkeypatch.setenv("WORKBENCH_TEST_CHANGED", "1")
    assert standby.take("torch") is None
    assert standby.current() is None
    assert fr.proc.wait(5) is not None
    monkeypatch.delenv("WORKBENCH_TEST_CHANGED")
    fr = standby.begin()
    assert standby.take("jax") is None and standby.current() is fr  # a JAX start leaves it waiting
    assert standby.take("torch") is fr
    fr.close()  # never handed a start: it ends at the end of its stdin
    assert fr.proc.wait(30) == 0


def _kernel_pid(kc) -> int:
    reply, msgs = execute(kc, "import os; print('PID', os.getpid())")
    return int(_line(printed(msgs), "PID")[0])
