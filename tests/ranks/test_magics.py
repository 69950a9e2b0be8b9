"""Tier 4: the magics driven through a real IPython shell on the shared ranks."""

import pytest


def run(shell, cell):
    result = shell.run_cell(cell)
    return result


def test_cell_output_grouped_per_rank_in_rank_order(shell, capsys):
    r = run(
        shell,
        "%%distrain\nfrom workbench import engine\nimport time, sys\n"
        "time.sleep(0.05 * (3 - engine.rank))\nprint('hello from', engine.rank)\n"
        "print('careful', file=sys.stderr)\nengine.rank * 10",
    )
    assert r.success
    out, err = capsys.readouterr()
    lines = [l for l in out.splitlines() if l.startswith("[rank")]
    assert lines == [
        "[rank 0] hello from 0",
        "[rank 0] Out: 0",
        "[rank 1] hello from 1",
        "[rank 1] Out: 10",
        "[rank 2] hello from 2",
        "[rank 2] Out: 20",
        "[rank 3] hello from 3",
        "[rank 3] Out: 30",
    ]
    assert [l for l in err.splitlines() if "careful" in l] == [f"[rank {i}] careful" for i in range(4)]


def test_cell_state_persists_and_ranks_option(shell, capsys):
    assert run(shell, "%%distrain\ncounter = 0").success
    assert run(shell, "%%distrain --ranks 1-2\ncounter += 5").success
    assert run(shell, "%%distrain\nprint(counter)").success
    out, _ = capsys.readouterr()
    assert [l for l in out.splitlines() if l.startswith("[rank")] == [
        "[rank 0] 0",
        "[rank 1] 5",
        "[rank 2] 5",
        "[rank 3] 0",
    ]


def test_exception_on_one_rank_is_tagged(shell, capsys):
    r = run(shell, "%%distrain\nfrom workbench import engine\nassert engine.rank != 1, 'rank one is odd'")
    assert not r.success
    assert "rank(s) 1" in str(r.error_in_exec)
    _, err = capsys.readouterr()
    tagged = [l for l in err.splitlines() if "rank one is odd" in l]
    assert tagged and all(l.startswith("[rank 1]") for l in tagged)


def test_rich_display_from_a_rank_reaches_the_notebook(shell):
    published = []
    original = shell.display_pub.publish
    shell.display_pub.publish = lambda data, metadata=None, **kw: published.append(data)
    try:
        r = run(
            shell,
            "%%distrain --ranks 0\nimport pandas as pd\nfrom IPython.display import HTML, display\n"
            "display(HTML('<b>bold</b>'))\npd.DataFrame({'x': [1, 2]})",
        )
    finally:
        shell.display_pub.publish = original
    assert r.success
    assert any(d.get("text/html") == "<b>bold</b>" for d in published)
    assert any("<table" in d.get("text/html", "") for d in published)


def test_push_pull_through_magics(shell):
    shell.user_ns["weights"] = [1, 2, 3]
    assert run(shell, "%distrain push weights").success
    r = run(shell, "%distrain pull weights --ranks 2-3")
    assert r.result == [[1, 2, 3], [1, 2, 3]]


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("%%distrain --ranks 9\nx = 1", "rank(s) 9 do not exist"),
        ("%%distrain --timeout 0\nx = 1", "argument --timeout: expected a positive number of seconds"),
        ("%distrain start -n 2", "already running"),
        ("%distrain push no_such_variable", "no notebook variable named no_such_variable"),
    ],
)
def test_bad_input_is_refused_and_ranks_unchanged(shell, ranks4, line, fragment):
    pids = [p.pid for p in ranks4.procs]
    assert run(shell, "%%distrain\nsentinel = 42").success
    r = run(shell, line)
    assert not r.success and fragment in str(r.error_in_exec)
    assert [p.pid for p in ranks4.procs] == pids
    assert ranks4.pull("sentinel") == [42] * 4


def test_cell_timeout_reports_where_ranks_are_stuck(shell, ranks4):
    r = run(
        shell,
        "%%distrain --timeout 1.5\nfrom workbench import engine\nimport time\n"
        "def waiting_for_godot():\n    time.sleep(4)\nif engine.rank == 2:\n    waiting_for_godot()",
    )
    assert not r.success
    msg = str(r.error_in_exec)
    assert "still running after 1.5 s on ranks 2" in msg
    assert "waiting_for_godot" in msg
    ranks4.execute("pass", timeout=10)  # the rank finishes its sleep and is usable again


def record_stdout(monkeypatch) -> list:
    """(time, text) of every write to sys.stdout from now on, as they happen. Called inside
    the test: pytest's own capture replaces sys.stdout again after fixtures are set up."""
    import sys
    import time

    writes = []

    class Recorder:
        def write(self, text):
            writes.append((time.monotonic(), text))

        def flush(self):
            pass

    monkeypatch.setattr(sys, "stdout", Recorder())
    return writes


def test_long_cell_streams_output_while_running(shell, monkeypatch):
    """Output of a cell that runs for seconds shows up while it runs, still tagged per rank."""
    import time

    writes = record_stdout(monkeypatch)
    t0 = time.monotonic()
    r = shell.run_cell(
        "%%distrain --ranks 0,1\nimport time\nprint('first', flush=True)\ntime.sleep(5)\nprint('second')"
    )
    t_end = time.monotonic()
    assert r.success
    first = [t for t, text in writes if "first" in text]
    assert first and all(t < t_end - 1.0 for t in first), "first lines only appeared at the end"
    text = "".join(w for _, w in writes)
    assert text.count("[rank 0] first") == 1 and text.count("[rank 1] second") == 1
    assert t_end - t0 >= 5
