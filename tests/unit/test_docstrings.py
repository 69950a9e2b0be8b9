"""Docstrings and comments say why in a line or two: a module docstring stays short, and no
docstring or comment narrates the history of a change or a measured figure (those live in
docs/findings.md and benchmarks/FINDINGS.md, beside their result files)."""

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_MODULE_DOC_LINES = 8

# The history of a change, told in the code.
HISTORY = [
    r"\bas before\b",
    r"\b(?:it|this|they|which|we) used to\b",  # not "the tool used to compare": a participle
    r"\bno longer (?:needed|used|necessary|required)\b",
    r"\bpreviously\b",
    r"\bformerly\b",
    r"\b(?:before|since|after) (?:this|the|that) (?:change|fix|rewrite|commit)\b",
    r"\bthe old (?:code|version|way|path|design)\b",
    r"\bwas ~?\d+(?:\.\d+)? ?(?:ms|us|µs|s|MB|GB|%)",
    r"\bthe (?:earlier|previous) (?:code|implementation)\b",
    # a mechanism the code replaced: "the 4 polls a second it replaced", "the retry this wait replaced"
    r"\b(?:polls?|polling|retry|retries|loop|timer|wait|check|code|version|path|design)\b[^.;,]{0,20}?"
    r"\b(?:it|this \w+|these \w+) replaced\b",
    r"\b(?:it|they) (?:polled|woke)\b|\bpolling (?:woke|took|cost)\b",  # "it polled ten times a second"
    r"\bwas (?:most|half|a third|a quarter|the bulk)\b",  # "converting the lists was most of a redraw"
]
# A measured figure: an approximate or measured amount of time, memory, share, rate or speed-up
# (the unit ends where no letter follows: "%" has no word boundary after it).
UNIT = r"(?:ms|us|µs|s|MB|GB|KB|MiB|GiB|%|x|(?:steps|events|calls|redraws)/s|times a (?:second|step))"
FIGURE = rf"\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?{UNIT}(?!\w)"
MEASURED = [
    rf"(?:~|\babout |\baround |\broughly ) ?{FIGURE}",  # "~13 ms of CPU": only a measurement is approximate
    rf"\b(?:measured|took|costs?|cost us)\b[^.;]{{0,60}}?{FIGURE}",
    rf"{FIGURE}[^.;]{{0,60}}?\b(?:measured|on this machine|on 2 cores|on \d+ CPU ranks)\b",
    r"\b\d+ ranks?: ~?\d+(?:\.\d+)?(?:-\d+(?:\.\d+)?)? ?(?:ms|s)\b",  # "64 ranks: 5-10 s"
    # a cost per something, on so many ranks: "4 ms a call for 1024 ranks", "~8 ms of CPU a redraw of 2 ranks"
    rf"{FIGURE}(?: of CPU)? (?:a|per|each) (?:call|step|second|redraw|cell|beat)\b[^.;]{{0,30}}?"
    r"\b(?:for|on|of|with|at) \d+ (?:CPU |GPU )?ranks\b",
    rf"{FIGURE} here\b",  # "took 75 s here"
]
NARRATION = re.compile("|".join(f"(?:{p})" for p in HISTORY + MEASURED), re.IGNORECASE)


def _modules() -> list[Path]:
    return sorted(p for p in (ROOT / "workbench").rglob("*.py") if "labextension" not in p.parts)


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _texts(path: Path):
    """(line, text) of every docstring and comment of a module."""
    src = path.read_text()
    tree = ast.parse(src)
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc is not None:
                yield node.body[0].lineno, doc
    for tok in tokenize.generate_tokens(io.StringIO(src).readline):
        if tok.type == tokenize.COMMENT:
            yield tok.start[0], tok.string


def _long(path: Path) -> int | None:
    doc = ast.get_docstring(ast.parse(path.read_text()), clean=False)
    n = len(doc.strip("\n").splitlines()) if doc else 0
    return n if n > MAX_MODULE_DOC_LINES else None


def narration(text: str) -> list[str]:
    """The phrases of ``text`` that narrate history or a measurement (joined over line breaks)."""
    flat = re.sub(r"\s*\n\s*#?\s*", " ", text)
    return [m.group(0) for m in NARRATION.finditer(flat)]


def _hits(path: Path) -> list[str]:
    return [f"{_rel(path)}:{line}: {h!r}" for line, text in _texts(path) for h in narration(text)]


def test_module_docstrings_are_short():
    long = {_rel(p): n for p in _modules() if (n := _long(p))}
    assert not long, (
        f"module docstrings over {MAX_MODULE_DOC_LINES} lines (say what the module holds and why; "
        f"move how-it-works to its function or a docs/ page, figures to benchmarks/FINDINGS.md): {long}"
    )


def test_no_history_or_measurements_narrated():
    hits = [h for p in _modules() for h in _hits(p)]
    hits += [
        h for p in sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "gpu").glob("*.py")) for h in _hits(p)
    ]
    assert not hits, (
        "docstrings and comments that narrate a change's history or a measured figure (say why; "
        "figures go to benchmarks/FINDINGS.md with their result file):\n" + "\n".join(hits)
    )


@pytest.mark.parametrize(
    "text",
    [
        "the board costs a few microseconds; the gloo all-gather cost ~1.1 ms of a 47 ms step",
        "reading USS of a\n    # 450 MB rank costs ~13 ms of CPU",
        "with tens of them at once (64 ranks: 5-10 s; a file store: 0.3 s)",
        "a try every 0.1 s, as before",
        "it used to poll for a file every 10 ms",
        "this is no longer needed",
        "was 5 s, now 0.3 s",
        "Measured on 2 CPU ranks: 2.5x faster",
        "the collector and the redraw used ~4.5% of a core (now ~1.5%)",
        "trying every 0.1 s rebuilt it ~7 times a second",
        "one process holding torch's import (about 235 MB resident)",
        "each through the client's traits (4 ms a call for 1024 ranks)",
        "a transaction of the store: 0.1-0.5 s here, whatever its size",
        "kept up with ~15 steps/s of 2 ranks",
        "the fixed retry this wait replaced",
        "a run costs no wake-ups (the 4 polls a second it replaced)",
        "(it polled ten times a second, on the cores the ranks train on)",
        "sleep until it exits; polling woke twice a second",
        "converting the whole lists each time was most of what was left of a redraw's CPU",
        "at 300 ms that wait was half a second of the start",
        "unlike the earlier code, one message",
    ],
)
def test_narration_is_caught(text):
    assert narration(text), text


@pytest.mark.parametrize(
    "text",
    [
        "every ``BEAT_S`` seconds (default 2 s)",
        "a try every 0.1 s, doubling to 2 s",
        "timeout: seconds to wait (30 s by default)",
        "the memory_census dict says what was measured when",
        "the tool used to compare them",
        "the pid of a rank whose process no longer exists",
        "sizes in MB, e.g. 512 MB",
        "a 2x2 mesh of 4 ranks",
        "a 2x2 mesh, 4% of the budget",  # a share named for what it is
        "the spare forks them in the places of the ranks it replaced",
        "rows a rollback replaced",
        "the seconds it took",
        "1.5 s of silence on 4 ranks' heartbeats",
        "about the most characters of printed output shown",
        "waits at most 30 s for the ranks to answer",
        "every 300 ms while the ranks register, 3 s once every rank beats",
    ],
)
def test_api_units_are_not_narration(text):
    assert not narration(text), narration(text)
