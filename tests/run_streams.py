"""Run the suite's test groups in streams side by side: ``make test``'s runner.

Usage: ``python tests/run_streams.py LOG_DIR STREAM [STREAM ...] [--then STREAM ...]``,
each STREAM a comma-separated list of ``name=glob[ glob...]`` groups run one after another,
one pytest process per group (each with rank sets of its own); a glob written ``!glob``
takes its files out of the group (pytest's ``--ignore``), and a test id (``FILE::TEST``)
is passed to pytest as it is (a group of tests from several tiers in one process). The streams of a phase run at
the same time, so that two groups that each use well under both cores overlap; ``--then``
starts a phase that begins when the one before has ended (for groups with time bounds that
should run with nothing beside them).

Each group writes to ``LOG_DIR/<name>.log`` (and pytest's JUnit record of every test to
``LOG_DIR/<name>.xml``); when it ends its log is printed whole (one group at a time, so two
streams never interleave), and the run ends with a table of every group's result and time,
then every skipped test with its reason. A group fails when pytest fails, and when nothing in
it ran (every test skipped, or none collected) unless every skip is the one a machine may
lawfully lack (``needs a CUDA GPU``). With ``CI=true`` a test skipped for any other reason
fails its group too: CI installs everything the tiers need (``.ci/run``), so a skip there is a
tier that vanished. The exit status is 1 if any group failed, 2 on a bad argument.
A group whose globs match nothing (no test file there yet) is listed as empty, not run.
"""

from __future__ import annotations

import glob
import os
import pathlib
import re
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

PYTEST = [sys.executable, "-m", "pytest", "-q", "-ra", "--durations=10"]
# the one reason a test may be skipped in CI: the machine has no GPU (tests/gpu)
ALLOWED_SKIP = "needs a CUDA GPU"


def in_ci(env=os.environ) -> bool:
    return env.get("CI", "").strip().lower() in ("true", "1", "yes")


def _test_id(case: ET.Element) -> str:
    """``tests/ranks/test_x.py::test_y[p]`` from a JUnit testcase (classname ``tests.ranks.test_x``)."""
    cls, name = case.get("classname", ""), case.get("name", "")
    parts = cls.split(".") if cls else []
    # a test method of a class: the class is the classname's last part (capitalised by convention)
    mod, klass = (parts[:-1], parts[-1]) if len(parts) > 1 and parts[-1][:1].isupper() else (parts, "")
    return "/".join(mod) + ".py::" + (f"{klass}::" if klass else "") + name


def _collection_skip(skipped: ET.Element) -> tuple[str, str] | None:
    """A module skipped as it was collected: its file and the reason, from the text pytest writes
    (the repr of ``(path, line, 'Skipped: reason')``)."""
    m = re.match(r"\('(.*?)', \d+, '(?:Skipped: )?(.*)'\)\s*$", (skipped.text or "").strip(), re.S)
    if m is None:
        return None
    path = m.group(1)
    return (os.path.relpath(path) if os.path.isabs(path) else path), m.group(2)


def read_outcomes(xml_text: str) -> tuple[int, list[tuple[str, str]]]:
    """From pytest's JUnit XML: how many tests ran (passed, failed or errored; an expected failure
    ran too), and each skipped test (or module) with its reason."""
    ran, skips = 0, []
    for case in ET.fromstring(xml_text).iter("testcase"):
        skipped = case.find("skipped")
        if skipped is None or skipped.get("type") == "pytest.xfail":
            ran += 1
        elif skipped.get("message") == "collection skipped":
            skips.append(_collection_skip(skipped) or (_test_id(case), (skipped.text or "").strip()))
        else:
            skips.append((_test_id(case), skipped.get("message", "").strip()))
    return ran, skips


def judge(rc: int, ran: int, skips: list[tuple[str, str]], ci: bool) -> str:
    """A group's outcome: ``passed``, ``skipped (needs a CUDA GPU)`` or ``FAILED (...)``."""
    if rc != 0:
        return f"FAILED (exit {rc})"
    banned = [s for s in skips if s[1] != ALLOWED_SKIP]
    if ci and banned:
        return f"FAILED ({len(banned)} skipped in CI)"
    if ran == 0:
        return f"skipped ({ALLOWED_SKIP})" if skips and not banned else "FAILED (nothing ran)"
    return "passed"


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
        self.skips: list[tuple[str, str, str]] = []  # group, test, reason
        self.ci = in_ci()

    def group(self, name: str, globs: list[str]) -> None:
        left_out = sorted({p for g in globs if g.startswith("!") for p in glob.glob(g[1:])})
        paths = sorted({p for g in globs if not g.startswith("!") for p in _matches(g)} - set(left_out))
        if not paths:
            self.results.append((name, "empty", 0.0))
            return
        log, record = self.logs / f"{name}.log", self.logs / f"{name}.xml"
        record.unlink(missing_ok=True)
        env = dict(os.environ, OMP_NUM_THREADS="1")
        start = time.monotonic()
        with open(log, "w") as out:
            ignore = [f"--ignore={p}" for p in left_out]
            rc = subprocess.call(
                [*PYTEST, f"--junitxml={record}", *ignore, *paths], stdout=out, stderr=subprocess.STDOUT, env=env
            )
        took = time.monotonic() - start
        try:
            ran, skips = read_outcomes(record.read_text())
        except (OSError, ET.ParseError):  # pytest wrote no record (it could not start): its exit says why
            ran, skips = 0, []
        outcome = judge(rc, ran, skips, self.ci)
        with self.printing:
            print(f"\n===== {name}: {outcome} in {took:.0f} s ({' '.join(globs)}) =====", flush=True)
            sys.stdout.write(log.read_text(errors="replace"))
            sys.stdout.flush()
            self.results.append((name, outcome, took))
            self.skips.extend((name, test, reason) for test, reason in skips)

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
        print(f"  {name:<16} {outcome:<28} {took:5.0f} s")
    missing = set(names) - {name for name, _, _ in runner.results}
    if missing:  # a stream that broke off (its error above) leaves its other groups unrun
        print(f"  not run: {', '.join(sorted(missing))}")
    print_skips(runner.skips, runner.ci)
    return 0 if not missing and all(not o.startswith("FAILED") for _, o, _ in runner.results) else 1


def print_skips(skips: list[tuple[str, str, str]], ci: bool) -> None:
    """Every skipped test with its reason, tests of one reason together; under CI the ones that
    fail the run are marked."""
    if not skips:
        print("\n===== no test was skipped")
        return
    by_reason: dict[tuple[str, str], list[str]] = {}
    for group, test, reason in skips:
        by_reason.setdefault((group, reason), []).append(test)
    print(f"\n===== {len(skips)} skipped" + (" (CI=true: only '" + ALLOWED_SKIP + "' may skip)" if ci else ""))
    for (group, reason), tests in by_reason.items():
        mark = "  FAILS CI" if ci and reason != ALLOWED_SKIP else ""
        print(f"  [{group}] {len(tests)} skipped: {reason}{mark}")
        for test in tests:
            print(f"      {test}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
