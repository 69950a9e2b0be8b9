"""A cell's printed output, bounded: the rank's side (``engine.rank_log``) passes a head on, keeps a
tail, counts what it cut and writes every line to its log; the notebook's side renders the cut
line with how to see the rest; ``shared.rank_logs`` reads a log's last lines or its matches."""

import io

import pytest

from workbench.engine import rank_log
from workbench.shared import output_cut, rank_logs


class KernelStream(io.TextIOBase):
    """Stands in for ipykernel's OutStream: a Python stream whose ``write`` may be replaced."""

    def __init__(self):
        self.sent: list[str] = []

    def write(self, text):
        self.sent.append(text)
        return len(text)


@pytest.fixture
def streams(tmp_path):
    out, err = KernelStream(), KernelStream()
    rank_log.install(str(tmp_path / "logs"), 3, {"stdout": out, "stderr": err})
    try:
        yield out, err, tmp_path / "logs" / "rank3.log"
    finally:
        rank_log.uninstall()


def lines(n: int, start: int = 0) -> list[str]:
    return [f"step {i} loss 0.25" for i in range(start, start + n)]


def test_a_flood_sends_a_head_a_cut_line_and_a_tail_and_logs_every_line(streams):
    out, err, log = streams
    rank_log.begin(4000)
    for line in lines(20_000):
        print(line, file=out)
    print("an error line", file=err)
    rank_log.end()
    sent = "".join(out.sent)
    assert len(sent) < 4000 + 200  # the limit, and the cut line
    head, tail = sent.partition("cut here")[0].rsplit("\n", 1)[0], sent.rsplit("cut here", 1)[1]
    assert head.startswith("step 0 loss 0.25\nstep 1 loss")
    assert tail.endswith("step 19999 loss 0.25\n")
    shown = [x for x in sent.splitlines() if x.startswith("step ")]
    assert shown == [f"step {int(x.split()[1])} loss 0.25" for x in shown]  # whole lines, none broken
    cut_lines, markers = output_cut.cut_count(sent)
    assert markers == 1 and cut_lines + len(shown) == 20_000  # what was cut, counted exactly
    assert "".join(err.sent) == "an error line\n"  # a stream that did not flood is untouched
    logged = log.read_text().splitlines()
    assert logged[0].startswith("──── cell at ")
    assert logged[1:] == [*lines(20_000), "an error line"]


def test_the_log_keeps_the_order_of_both_streams_and_a_quiet_cell_writes_nothing(streams, tmp_path):
    out, err, log = streams
    rank_log.begin(4000)
    rank_log.end()
    assert not log.exists()  # a quiet cell: no file
    rank_log.begin(None)  # --output all
    for i in range(3000):
        print(f"out {i}", file=out)
        if i % 1000 == 0:
            print(f"err {i}", file=err)
    rank_log.end()
    assert "".join(out.sent) == "".join(f"out {i}\n" for i in range(3000))  # all of it
    logged = log.read_text().splitlines()[1:]
    want = []
    for i in range(3000):
        want.append(f"out {i}")
        if i % 1000 == 0:
            want.append(f"err {i}")
    assert logged == want


def test_a_log_that_cannot_be_written_passes_everything_on_and_says_why_once(tmp_path):
    out, err = KernelStream(), KernelStream()
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    rank_log.install(str(blocked / "logs"), 0, {"stdout": out, "stderr": err})
    try:
        rank_log.begin(4000)
        for line in lines(2000):
            print(line, file=out)
        rank_log.end()
    finally:
        rank_log.uninstall()
    said = "".join(err.sent)
    assert said.startswith(f"(no log of this rank's output in {blocked / 'logs'}: ") and said.count("\n") == 1
    assert "".join(out.sent) == "".join(f"{line}\n" for line in lines(2000))  # nothing lost, nothing cut


def test_the_notebook_renders_the_cut_line_with_how_to_see_the_rest():
    text = "a\n" + output_cut.marker(199_000, 12 << 20) + "z\n"
    assert "… 199,000 lines (12.0 MiB) cut here" in text
    shown = output_cut.render(text, "0-3")
    assert "`%distrain logs --ranks 0-3 --tail 200`" in shown and "--output all" in shown
    assert output_cut.cut_count(shown) == (199_000, 1)
    assert output_cut.render("no cut\n", "1") == "no cut\n"


def test_output_limits_parse_and_a_bad_one_says_what_works():
    assert output_cut.parse_limit("all") is None
    assert output_cut.parse_limit("200k") == 200 << 10
    assert output_cut.parse_limit("4M") == 4 << 20 and output_cut.parse_limit("1048576") == 1 << 20
    with pytest.raises(ValueError, match="`all`.*200k or 4M"):
        output_cut.parse_limit("lots")
    assert output_cut.per_stream(1 << 20, 4) == 131072 and output_cut.per_stream(1 << 20, 1024) == output_cut.FLOOR


def test_a_log_gives_its_last_lines_and_its_matches(tmp_path):
    log = tmp_path / "rank0.log"
    log.write_text("".join(f"step {i} {'nan' if i % 5000 == 7 else 'ok'}\n" for i in range(50_000)))
    tail = rank_logs.read(str(log), tail=200)
    assert [t for _, t in tail.lines] == [f"step {i} ok" for i in range(49_800, 50_000)]
    found = rank_logs.read(str(log), grep=r"\bnan$")
    assert found.matched == 10 and [n for n, _ in found.lines] == [8 + 5000 * k for k in range(10)]
    last2 = rank_logs.read(str(log), grep="nan", tail=2)
    assert last2.matched == 10 and [t for _, t in last2.lines] == ["step 40007 nan", "step 45007 nan"]
    small = rank_logs.read(str(log), tail=50_000, limit=1000)
    assert sum(len(t) + 1 for _, t in small.lines) <= 1000 and small.lines[-1][1] == "step 49999 ok"
    assert rank_logs.read(str(tmp_path / "none.log"), tail=5).note.startswith("no log yet")
