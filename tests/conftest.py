"""Shared fixtures: one live rank set of each size for the whole session.

Starting ranks costs seconds, so tests that only *use* ranks share the
session-scoped ``ranks2`` / ``ranks4`` sets (they must leave them as they found
them). Tests that kill, resize or restart ranks use ``fresh_ranks``, which starts
its own set and checks afterwards, by pid, that nothing it started is alive.

All Jupyter / IPython / ipyparallel state lives under ``.state/test`` inside the work
tree, never in the home directory; C++ ops built on first use under ``.state/torch_extensions``.
"""

from __future__ import annotations

import os
import pathlib
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
STATE = ROOT / ".state" / "test"
for var, sub in (
    ("IPYTHONDIR", "ipython"),
    ("JUPYTER_RUNTIME_DIR", "jupyter/runtime"),
    ("JUPYTER_CONFIG_DIR", "jupyter/config"),
    ("JUPYTER_DATA_DIR", "jupyter/data"),
    ("MPLCONFIGDIR", "mpl"),
):
    os.environ[var] = str(STATE / sub)
    (STATE / sub).mkdir(parents=True, exist_ok=True)
# C++ ops built on first use (DeepSpeed's async I/O for NVMe offload) are cached in the tree,
# where `make test` builds them before the suite, not in ~/.cache
os.environ["TORCH_EXTENSIONS_DIR"] = str(ROOT / ".state" / "torch_extensions")
os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("PYDEVD_DISABLE_FILE_VALIDATION", "1")

import psutil  # noqa: E402
import pytest  # noqa: E402
import rank_import_watch  # noqa: E402
from trainer_cleanup import clean_trainer  # noqa: E402, F401  (tests import it from here)

from workbench.notebook import api, session  # noqa: E402
from workbench.notebook.cluster import RankSet  # noqa: E402


def alive(pids) -> list[int]:
    out = []
    for pid in pids:
        try:
            if psutil.Process(pid).status() != psutil.STATUS_ZOMBIE:
                out.append(pid)
        except psutil.NoSuchProcess:
            pass
    return out


def wait_until(predicate, timeout: float, what: str) -> None:
    """Poll ``predicate`` until it holds; fail naming ``what`` after ``timeout`` seconds. For a test
    that must wait for something to happen (every rank inside its loop), never for a fixed time."""
    import time

    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout:g} s: {what}")
        time.sleep(0.02)


def ranks_in_loop(folder, n: int, timeout: float = 60.0) -> None:
    """Wait until ``n`` ranks wrote their ``in-loop-<rank>`` file in ``folder`` (a cell's loop writes
    it after its first collective there: every rank is then inside it)."""
    wait_until(lambda: len(list(pathlib.Path(folder).glob("in-loop-*"))) >= n, timeout, f"{n} ranks in their loop")


# the ranks import test helpers (and the test modules whose functions they run) from these;
# so does this process, where a test uses another tier's helper (test file names are unique)
RANK_SYS_PATH = tuple(str(ROOT / "tests" / sub) for sub in ("", "unit", "ranks", "notebooks", "gpu"))
sys.path.extend(p for p in RANK_SYS_PATH if p not in sys.path)


def _session_ranks(n: int):
    rs = RankSet.start(n=n, backend="gloo", threads=1, sys_path=RANK_SYS_PATH)
    rs.apply(rank_import_watch.install)  # tests/ranks/test_worked_ranks.py reads it at the end
    yield rs
    pids = list(rs.started_pids)
    rs.stop()
    assert alive(pids) == [], f"processes left behind by the {n}-rank set: {alive(pids)}"


@pytest.fixture
def jupyter_dirs(monkeypatch, request):
    """A private Jupyter/IPython state folder under ``.state/`` for one executed notebook.

    Also the notebook's ``WORKBENCH_RUN_DIR`` (where it writes exports), removed afterwards.
    """
    import tempfile

    from notebook_runs import private_env

    STATE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=STATE, prefix=f"{request.node.name[:40]}-") as tmp:
        for var, value in private_env(pathlib.Path(tmp)).items():
            if os.environ.get(var) != value:  # its state folders, OMP_NUM_THREADS, WORKBENCH_RUN_DIR
                monkeypatch.setenv(var, value)
        yield pathlib.Path(tmp)


@pytest.fixture(scope="session")
def ranks4():
    """Four live gloo ranks shared by the whole session; also the API's current set."""
    gen = _session_ranks(4)
    rs = next(gen)
    with session.using(rs):
        yield rs
    next(gen, None)


@pytest.fixture(scope="session")
def ranks2():
    """Two live gloo ranks shared by the whole session."""
    yield from _session_ranks(2)


@pytest.fixture
def fresh_ranks():
    """Start private rank sets (``start(n)``) through the API; stop them and check pids after.

    The shared set, if it is the API's current one, is put aside and restored.
    """
    away = session.using(None)
    away.__enter__()
    had = set(api.sessions())
    started: list[RankSet] = []

    def start(n: int = 2, **kwargs) -> RankSet:
        kwargs.setdefault("backend", "gloo")
        kwargs.setdefault("threads", 1)
        kwargs.setdefault("sys_path", RANK_SYS_PATH)
        rs = api.start(n, **kwargs)
        started.append(rs)
        return rs

    start.started = started
    try:
        yield start
    finally:
        for name, sess in api.sessions().items():
            if sess.rankset is not None and sess.rankset not in started:
                started.append(sess.rankset)
            if sess.running:
                api.stop(name)
        pids = [p for rs in started for p in rs.started_pids]
        for rs in started:
            rs.stop()
        away.__exit__()
        for name in set(api.sessions()) - had:  # the next test starts from a kernel without them
            session.KERNEL.by_name.pop(name)
        assert alive(pids) == [], f"processes left behind: {alive(pids)}"


@pytest.fixture
def shell(ranks4):
    """A real IPython shell with ``%load_ext workbench``, its current rank set the shared one."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()  # one real InteractiveShell for the session
    ip.run_line_magic("load_ext", "workbench")
    with session.using(ranks4):
        yield ip


# ---------------------------------------------------------------------------- tiers
# Each folder is a tier; its tests get the tier's marker (`-m pure` is `make test-fast`).
TIERS = {
    "unit": "pure",
    "ranks": "ranks",
    "notebooks": "notebooks",
    "browser": "browser",
    "cluster": "cluster",
    "gpu": "gpu",
    "install": "install",
}


def pytest_collection_modifyitems(config, items):
    tests = ROOT / "tests"
    for item in items:
        try:
            parts = pathlib.Path(str(item.path)).resolve().relative_to(tests).parts
        except ValueError:
            continue
        if len(parts) > 1 and parts[0] in TIERS:
            item.add_marker(getattr(pytest.mark, TIERS[parts[0]]))


@pytest.fixture
def ipshell():
    """A real IPython shell with ``%load_ext workbench`` (its current rank set left as it is)."""
    from IPython.testing.globalipapp import get_ipython

    ip = get_ipython()
    ip.run_line_magic("load_ext", "workbench")
    return ip


@pytest.fixture
def shell2(ipshell, ranks2):
    """The IPython shell with the shared 2-rank set as the current one (restored afterwards)."""
    with session.using(ranks2):
        yield ipshell


@pytest.fixture
def current2(ranks2):
    """The shared 2-rank set made the API's current one (as the set a user trains on is, so that
    ``metrics()`` reads its stream); afterwards no trainer and the previous current set back."""
    try:
        with session.using(ranks2):
            yield ranks2
    finally:
        ranks2.apply(clean_trainer, timeout=60)
