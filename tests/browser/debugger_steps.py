"""Steps in JupyterLab's debugger on a notebook's ranks, shared by the browser tier's test
(ranks on this host) and the cluster tier's (a rank on a second host over SSH)."""

from __future__ import annotations

import re
import time

from .helpers import ROOT, STATE, open_notebook, run_cell, shot, wait_kernel_idle, write_notebook

START = "%load_ext workbench\n%distrain start -n 2 --backend gloo --threads 1"
CELL = (
    "%%distrain\n"
    "from workbench import engine\n"
    "rank = engine.rank\n"
    "x = rank * 10\n"  # line 4: the breakpoint
    "y = x + 1\n"
    "print('rank', rank, 'y', y, 'on', engine.host)"
)


def notebook(name: str, start: str) -> str:
    folder = STATE / "debugger"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    write_notebook(path, [start, CELL])
    return path.relative_to(ROOT).as_posix()


def switch_debugger_on(page) -> None:
    page.locator(".jp-NotebookPanel-toolbar .jp-DebuggerBugButton").first.click()
    page.locator(".jp-DebuggerCallstack").first.wait_for(state="visible", timeout=30_000)


def set_breakpoint(page, cell_text: str, line: int) -> None:
    """Click the breakpoint gutter beside line ``line`` of the cell holding ``cell_text``."""
    cell = page.locator(".jp-Notebook .jp-Cell", has_text=cell_text).first
    number = cell.locator(".cm-lineNumbers .cm-gutterElement", has_text=re.compile(rf"^{line}$"))
    number.wait_for(state="visible", timeout=30_000)
    row = number.bounding_box()
    gutter = cell.locator(".cm-gutter.cm-breakpoint-gutter").bounding_box()
    page.mouse.click(gutter["x"] + gutter["width"] / 2, row["y"] + row["height"] / 2)
    page.locator(".jp-DebuggerBreakpoint .jp-DebuggerBreakpoint-line", has_text=re.compile(rf"^{line}$")).wait_for(
        timeout=15_000
    )


def frames(page) -> list[tuple[str, str]]:
    """(name, location) of each entry of the debugger's call stack."""
    rows = page.locator(".jp-DebuggerCallstackFrame")
    return [
        (
            rows.nth(i).locator(".jp-DebuggerCallstackFrame-name").inner_text(),
            rows.nth(i).locator(".jp-DebuggerCallstackFrame-location").inner_text(),
        )
        for i in range(rows.count())
    ]


def wait_frames(page, count: int, timeout: float = 60_000) -> list[tuple[str, str]]:
    page.wait_for_function(
        f"document.querySelectorAll('.jp-DebuggerCallstackFrame').length === {count}", timeout=timeout
    )
    return frames(page)


def variable(page, name: str, within=None) -> str:
    """The value the variables panel shows for ``name`` (at the top of the tree, or in ``within``)."""
    scope = within if within is not None else page.locator(".jp-DebuggerVariables")
    item = scope.locator(".jp-TreeItem", has=page.locator(f".jp-DebuggerVariables-name:text-is('{name}')")).first
    item.wait_for(state="visible", timeout=30_000)
    return item.locator(".jp-DebuggerVariables-detail").first.inner_text().strip()


def eventually(read, expected, timeout: float = 60.0):
    """Wait until ``read()`` gives ``expected`` (the panels fill in after the requests they make)."""
    deadline = time.monotonic() + timeout
    while True:
        got = read()
        if got == expected:
            return got
        assert time.monotonic() < deadline, f"still {got!r}, not {expected!r}"
        time.sleep(0.2)


def wait_variable(page, name: str, value: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    seen = None
    while time.monotonic() < deadline:
        try:
            seen = variable(page, name)
        except Exception:
            seen = None
        if seen == value:
            return
        time.sleep(0.2)
    raise AssertionError(f"the variables panel shows {name} = {seen!r}, not {value!r}")


def engine_rank(page) -> str:
    """Open ``engine`` in the variables panel; the ``rank`` it shows."""
    item = page.locator(
        ".jp-DebuggerVariables .jp-TreeItem", has=page.locator(".jp-DebuggerVariables-name:text-is('engine')")
    ).first
    item.locator(".jp-DebuggerVariables-name").first.click()
    return variable(page, "rank", within=item)


def tidy_for_a_picture(page) -> None:
    """The file browser folded away and the debugger's sidebar wider, for the screenshot."""
    current = page.locator(".jp-SideBar.jp-mod-left .lm-TabBar-tab.lm-mod-current")
    if current.count():
        current.first.click()
    handle = page.locator("#jp-main-split-panel > .lm-SplitPanel-handle:not(.lm-mod-hidden)").last
    box = handle.bounding_box()
    if box is not None:
        y = box["y"] + box["height"] / 2
        page.mouse.move(box["x"] + 1, y)
        page.mouse.down()
        page.mouse.move(box["x"] - 220, y, steps=5)
        page.mouse.up()


def run_to_the_breakpoint(page, lab, path: str) -> None:
    """Start the ranks, switch the debugger on, set the breakpoint, run the cell."""
    open_notebook(page, lab, path)
    run_cell(page, "%distrain start")
    first = page.locator(".jp-Notebook .jp-Cell").first.locator(".jp-OutputArea")
    started = eventually(lambda: "ranks up" in first.inner_text() or "Error" in first.inner_text(), True, 240)
    assert started and "Error" not in first.inner_text(), first.inner_text()
    wait_kernel_idle(page, timeout=60_000)
    switch_debugger_on(page)
    set_breakpoint(page, "x = rank * 10", 4)
    run_cell(page, "x = rank * 10")


def check_both_ranks_then_continue(page, hosts: list[str], shot_name: str) -> None:
    """Both ranks stopped at line 4; the variables of each; continue finishes the cell (each
    rank's output names its host, ``hosts[rank]``). A screenshot ``shot_name`` while stopped."""
    listed = wait_frames(page, 3)
    assert [name for name, _ in listed] == [
        "[ranks 0-1] every stopped rank",
        "[rank 0] <module>",
        "[rank 1] <module>",
    ]
    assert all(where.endswith(":4") for _, where in listed), listed
    # the entry of every rank: the scope switcher holds one scope per rank
    switcher = page.locator("select[aria-label='Scope']").first
    eventually(lambda: switcher.locator("option").all_inner_texts(), ["rank 0", "rank 1"])
    wait_variable(page, "rank", "0")
    switcher.select_option("rank 1")
    wait_variable(page, "rank", "1")
    # each rank's own entry: its locals, engine.rank among them
    page.locator(".jp-DebuggerCallstackFrame", has_text="[rank 0] <module>").click()
    wait_variable(page, "rank", "0")
    assert engine_rank(page) == "0"
    page.locator(".jp-DebuggerCallstackFrame", has_text="[rank 1] <module>").click()
    wait_variable(page, "rank", "1")
    # the line both stopped at is highlighted in the cell
    cell = page.locator(".jp-Notebook .jp-Cell", has_text="x = rank * 10").first
    assert "x = rank * 10" in cell.locator(".jp-DebuggerEditor-highlight").first.inner_text()
    tidy_for_a_picture(page)
    shot(page, shot_name)
    assert engine_rank(page) == "1"
    # continue with every rank chosen: the cell finishes with both ranks' output
    page.locator(".jp-DebuggerCallstackFrame", has_text="every stopped rank").click()
    page.locator("[data-command='debugger:continue']").first.click()
    wait_kernel_idle(page, timeout=60_000)
    out = page.locator(".jp-Notebook .jp-Cell", has_text="x = rank * 10").first.locator(".jp-OutputArea")
    assert out.inner_text().splitlines() == [
        f"[rank 0] rank 0 y 1 on {hosts[0]}",
        f"[rank 1] rank 1 y 11 on {hosts[1]}",
    ]
    assert page.locator(".jp-DebuggerCallstackFrame").count() == 0
