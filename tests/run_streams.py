"""Run the suite's test groups in streams side by side: ``make test``'s runner.

Usage: ``python tests/run_streams.py LOG_DIR STREAM [STREAM ...] [--then STREAM ...]``,
each STREAM a comma-separated list of ``name=glob[ glob...]`` groups run one after another,
one pytest process per group (each with rank sets of its own); a glob written ``!glob``
takes its files out of the group (pytest's ``--ignore``), and a test id (``FILE::TEST``)
is passed to pytest as it is (a group of tests from several tiers in one process). The streams of a phase run at
the same time, so that two groups that each use well under both cores overlap; ``--then``
starts a phase that begins when the one before has ended (for groups with time bounds that
should run with nothing beside them).

Each group writes to ``LOG_DIR/<name>.log``; when it ends its log is printed whole (one
group at a time, so two streams never interleave), and the run ends with a table of every
group's result and time. The exit status is 1 if any group failed, 2 on a bad argument.
A group whose globs match nothing (no test file there yet) is listed as empty, not run.
"""

from __future__ import annotations

import glob
import os
import pathlib
import subprocess
import sys
import threading
import time

PYTEST = [sys.executable, "-m", "pytest", "-q", "-ra", "--durations=10"]


def parse(stream: str) -> list[tuple[str, list[str]]]:
    groups = []
    for item in filter(None, (s.strip() for s in stream.split(","))):
        name, sep, globs = item.partition("=")
        if not sep or not name or not globs.split():
            raise ValueError(f"group {item!r} is not name=glob[ glob...] (e.g. unit=tests/unit)")
        groups.append((name, globs.split()))
    return groups


def _matches(pattern: str) -> list[str]:
    """The files ``pattern`` matches; a test id (``FILE::TEST``) as it is where its file exists."""
    if "::" in pattern:
        return [pattern] if os.path.isfile(pattern.split("::", 1)[0]) else []
    return glob.glob(pattern)


class Runner:
    def __init__(self, logs: pathlib.Path):
        self.logs = logs
        self.printing = threading.Lock()
        self.stopped = threading.Event()  # Ctrl-C: no stream starts another group
        self.results: list[tuple[str, str, float]] = []  # name, outcome, seconds

    def group(self, name: str, globs: list[str]) -> None:
        left_out = sorted({p for g in globs if g.startswith("!") for p in glob.glob(g[1:])})
        paths = sorted({p for g in globs if not g.startswith("!") for p in _matches(g)} - set(left_out))
        if not paths:
            self.results.append((name, "empty", 0.0))
            return
        log = self.logs / f"{name}.log"
        env = dict(os.environ, OMP_NUM_THREADS="1")
        start = time.monotonic()
        with open(log, "w") as out:
            ignore = [f"--ignore={p}" for p in left_out]
            rc = subprocess.call([*PYTEST, *ignore, *paths], stdout=out, stderr=subprocess.STDOUT, env=env)
        took = time.monotonic() - start
        outcome = "passed" if rc == 0 else f"FAILED (exit {rc})"
        with self.printing:
            print(f"\n===== {name}: {outcome} in {took:.0f} s ({' '.join(globs)}) =====", flush=True)
            sys.stdout.write(log.read_text(errors="replace"))
            sys.stdout.flush()
            self.results.append((name, outcome, took))

    def stream(self, groups: list[tuple[str, list[str]]]) -> None:
        for name, globs in groups:
            if self.stopped.is_set():
                return
            self.group(name, globs)


def main(argv: list[str]) -> int:
    phases: list[list[str]] = [[]]
    for arg in argv[1:]:
        if arg == "--then":
            phases.append([])
        else:
            phases[-1].append(arg)
    if len(argv) < 2 or not all(phases):
        print(
            "usage: run_streams.py LOG_DIR STREAM [STREAM ...] [--then STREAM ...] (STREAM: name=glob,name=glob...)",
            file=sys.stderr,
        )
        return 2
    try:
        streams = [[parse(s) for s in phase] for phase in phases]
    except ValueError as exc:
        print(f"run_streams.py: {exc}", file=sys.stderr)
        return 2
    names = [name for phase in streams for groups in phase for name, _ in groups]
    if len(set(names)) != len(names):
        print(f"run_streams.py: group names must differ (they name the logs): {names}", file=sys.stderr)
        return 2
    logs = pathlib.Path(argv[0])
    logs.mkdir(parents=True, exist_ok=True)
    runner = Runner(logs)
    start = time.monotonic()
    for phase in streams:
        threads = [threading.Thread(target=runner.stream, args=(groups,)) for groups in phase]
        for t in threads:
            t.start()
        try:
            for t in threads:
                t.join()
        except KeyboardInterrupt:  # it reached every pytest too (one process group): each ends its ranks
            runner.stopped.set()
            for t in threads:
                t.join()
            print("\n===== interrupted", file=sys.stderr)
            return 130
    shape = " then ".join(str(len(phase)) for phase in streams)
    print(f"\n===== {len(names)} groups, streams {shape}, {time.monotonic() - start:.0f} s; logs in {logs}")
    for name, outcome, took in runner.results:
        print(f"  {name:<12} {outcome:<16} {took:5.0f} s")
    missing = set(names) - {name for name, _, _ in runner.results}
    if missing:  # a stream that broke off (its error above) leaves its other groups unrun
        print(f"  not run: {', '.join(sorted(missing))}")
    return 0 if not missing and all(o in ("passed", "empty") for _, o, _ in runner.results) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
