"""Entry point of ranks on this host:
``python -m workbench.engine.preload [--fork [--standby-of PID]] [--framework torch|jax] [ipengine args]``.

It imports the rank's framework and ipyparallel's engine while the controller is still
writing its connection file, and with ``--fork`` imports once and forks the ranks, staying
their parent to report each one's exit: N ranks importing torch cost N times the CPU of one,
most of a start on a machine with fewer cores than ranks. The notebook sends the cluster as
one JSON line on stdin once it knows it (so this can start early, as a standby)."""

from __future__ import annotations

import importlib
import json
import os
import signal
import sys

from ..shared.wire import PRELOADS, READY

# what every engine imports once it has registered (its kernel's debugger, tornado's asyncio
# loop, the workbench's runtime, and rpc, whose requests every call of the notebook is, the
# bootstrap first), done once here before the forks rather than once per rank after them
# (benchmarks/FINDINGS.md: a 64-rank start). None starts a thread.
ENGINE_PRELOADS = (
    "ipykernel.debugger",
    "tornado.platform.asyncio",
    "IPython.core.completerlib",
    "IPython.extensions.storemagic",
    "IPython.core.oinspect",
    "IPython.core.logger",
    "pdb",
    "sqlite3",
    "workbench.engine.runtime",
    "workbench.engine.rpc",
    "workbench.engine.publisher",
    "workbench.engine.rank_debug",
    "workbench.engine.fanout",
)


def own_framework(argv: list[str]) -> tuple[str, list[str]]:
    """``--framework NAME`` taken out of the engine's arguments (default torch)."""
    if "--framework" not in argv:
        return "torch", argv
    i = argv.index("--framework")
    name = argv[i + 1] if i + 1 < len(argv) else ""
    if name not in PRELOADS:
        raise SystemExit(f"--framework needs one of {', '.join(PRELOADS)}: {' '.join(argv)}")
    return name, argv[:i] + argv[i + 2 :]


def own_imports(argv: list[str]) -> tuple[tuple[str, ...], list[str]]:
    """``--import MOD[,MOD...]`` taken out of the engine's arguments: more modules for a forking
    parent to import before its forks (a fault-tolerant run's spare: its ranks' first steps need them)."""
    if "--import" not in argv:
        return (), argv
    i = argv.index("--import")
    names = tuple(n for n in (argv[i + 1] if i + 1 < len(argv) else "").split(",") if n)
    if not names:
        raise SystemExit(f"--import needs module names, comma-separated: {' '.join(argv)}")
    return names, argv[:i] + argv[i + 2 :]


def own_args(argv: list[str]) -> tuple[bool, int | None, list[str]]:
    """``--fork`` and ``--standby-of PID`` taken out of the engine's arguments."""
    fork = "--fork" in argv
    rest = [a for a in argv if a != "--fork"]
    if "--standby-of" not in rest:
        return fork, None, rest
    i = rest.index("--standby-of")
    try:
        parent = int(rest[i + 1])
    except (IndexError, ValueError):
        raise SystemExit(f"--standby-of needs the notebook's pid: {' '.join(argv)}") from None
    return fork, parent, rest[:i] + rest[i + 2 :]


PR_SET_PDEATHSIG = 1


def end_with_parent(parent: int | None) -> None:
    """A standby: killed at once should the notebook die before it hands over a start
    (``None``: that watch is cleared, once the ranks are forked; they watch the notebook
    themselves, and this process reports their exits). Linux only; elsewhere the end of
    file on stdin ends a standby once its imports are done."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL if parent else 0, 0, 0, 0)
    except (OSError, AttributeError):
        return
    if parent and os.getppid() != parent:  # the notebook was gone before the watch was set
        os._exit(1)


# ipykernel leaves fd 1/2 uncaptured in a kernel whose environment says it runs under
# pytest; a rank never does (a test's ranks are processes of their own, as a user's are),
# so output from C code and child processes reaches the notebook there too
RANK_ENV_DROPPED = ("PYTEST_CURRENT_TEST",)


def main() -> None:
    open_files_to_hard_limit()
    for name in RANK_ENV_DROPPED:
        os.environ.pop(name, None)
    framework, rest = own_framework(sys.argv[1:])
    fork, standby_of, rest = own_args(rest)
    imports, rest = own_imports(rest)
    if standby_of:
        end_with_parent(standby_of)
    for module in PRELOADS[framework]:
        importlib.import_module(module)
    from ipyparallel.engine.app import main as engine_main

    if not fork:
        sys.argv = [sys.argv[0], *rest]
        engine_main()
        return
    # debugpy checks at import whether frozen modules hide breakpoints and prints a warning
    # into every rank's log; engines have no debugger channel to use it
    os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")
    for module in (*ENGINE_PRELOADS, *imports):
        importlib.import_module(module)
    if "numpy" in sys.modules:  # each fork reseeds it (_reseed)
        importlib.import_module("numpy.random")
    # interrupts are for the ranks (sent by pid); a Ctrl-C to the process group must not
    # end the parent that reports their exits
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    print(READY, flush=True)  # to the notebook's file until the setup (ForkedRanks.ready)
    line = sys.stdin.readline()
    if not line:  # the notebook ended, or gave up this start or standby: nothing to tidy
        os._exit(0)
    setup = json.loads(line)
    if standby_of:
        end_with_parent(None)
    ranks = int(setup["ranks"])
    os.environ.update(setup["env"])
    os.makedirs(setup["exit_dir"], exist_ok=True)
    log = os.open(setup["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(log, 1)
    os.dup2(log, 2)
    os.close(log)
    app = initialized_engine([*rest, *setup["engine_args"]])
    pids = []
    for _ in range(ranks):
        pid = os.fork()
        if pid == 0:
            # each rank its own session, as torchrun starts its workers: Linux's scheduler
            # autogroups are per session, and ranks sharing one lose CPU (benchmarks/FINDINGS.md)
            os.setsid()
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _reseed()
            own_engine(app)
            run_engine(app)
            return
        pids.append(pid)
    _reap(set(pids), setup["exit_dir"])
    # nothing to tidy here; a normal exit would spend seconds tearing down torch's modules
    os._exit(0)


def open_files_to_hard_limit() -> None:
    """Raise the descriptor limit to the hard limit before the ranks are forked (they inherit it):
    gloo connects a pair of ranks per socket, so a rank that talks to every other one of a
    1,024-rank set needs more than the 1,024 descriptors many systems start a process with."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (ValueError, OSError):  # an unlimited hard limit the kernel caps (nr_open)
            pass


def run_engine(app) -> None:
    """Run the engine until it is shut down. A shutdown stops the event loop that ipyparallel's
    ``run_sync`` waits on, which tornado reports as an error: that is the normal end, not a
    traceback for every rank's log at every stop."""
    try:
        app.start()
    except RuntimeError as e:
        if "Event loop stopped before Future completed" not in str(e):
            raise


def initialized_engine(argv: list[str]):
    """ipyparallel's engine application, configured (its arguments and config files parsed, the
    controller's connection file read: it waits for that file) once here rather than once in
    each rank. Nothing in it opens a socket or an event loop; :func:`own_engine` gives each
    fork its own identity."""
    from ipyparallel.engine.app import IPEngine

    app = IPEngine.instance()
    app.initialize(argv)
    return app


def own_engine(app) -> None:
    """In a fork of :func:`initialized_engine`: a session and engine identity of its own (the
    controller tells engines apart by it). Its ZMQ context and event loop are made on first
    use, in this process (checked: a parent's would be shared by every fork)."""
    from jupyter_client.session import Session

    for name in ("context", "loop"):  # made lazily; a parent's must not be shared
        if name in app._trait_values:
            raise RuntimeError(f"the engine's {name} was made before the ranks were forked")
    app.session = Session(parent=app)
    app.ident = app.session.session


def _reseed() -> None:
    """A fork shares its parent's random state: give each rank its own, as a new process has.
    (``random`` reseeds itself at fork; torch's default generator has a fixed seed anyway.)"""
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _reap(pids: set[int], exit_dir: str) -> None:
    """Wait for every rank; write each one's exit status (negative: the signal) as soon as it ends."""
    while pids:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            break
        except InterruptedError:
            continue
        pids.discard(pid)
        tmp = os.path.join(exit_dir, f".{pid}")
        with open(tmp, "w") as f:
            f.write(str(os.waitstatus_to_exitcode(status)))
        os.replace(tmp, os.path.join(exit_dir, str(pid)))


if __name__ == "__main__":
    main()
