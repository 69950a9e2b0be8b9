"""The suite's runner (``tests/run_streams.py``) judges a group by what ran, not only pytest's exit:
a group where nothing ran fails, and with ``CI=true`` a test skipped for any reason but the lack
of a CUDA GPU fails its group (the tier vanished). Read from pytest's JUnit record."""

import pytest
import run_streams as rs

RECORD = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest">
<testcase classname="tests.cluster" name="test_ssh" time="0"><skipped message="collection skipped">('tests/cluster/test_ssh.py', 25, 'Skipped: not installed: ip (iproute2)')</skipped></testcase>
<testcase classname="tests.gpu.test_x" name="test_a" time="0"><skipped type="pytest.skip" message="needs a CUDA GPU">/w/tests/gpu/test_x.py:2: needs a CUDA GPU</skipped></testcase>
<testcase classname="tests.ranks.test_y" name="test_b[4]" time="0"><skipped type="pytest.skip" message="torchft (the ft extra) is not installed">x</skipped></testcase>
<testcase classname="tests.ranks.test_y.TestGroup" name="test_c" time="0" />
<testcase classname="tests.ranks.test_y" name="test_d" time="0"><failure message="assert 0">...</failure></testcase>
<testcase classname="tests.ranks.test_y" name="test_e" time="0"><skipped type="pytest.xfail" message="known">x</skipped></testcase>
</testsuite></testsuites>"""


def test_the_record_gives_what_ran_and_each_skip_with_its_reason():
    ran, skips = rs.read_outcomes(RECORD)
    assert ran == 3  # a pass, a failure and an expected failure ran; the three skips did not
    assert skips == [
        ("tests/cluster/test_ssh.py", "not installed: ip (iproute2)"),  # a module skipped as it was collected
        ("tests/gpu/test_x.py::test_a", "needs a CUDA GPU"),
        ("tests/ranks/test_y.py::test_b[4]", "torchft (the ft extra) is not installed"),
    ]


@pytest.mark.parametrize(
    "rc, ran, skips, ci, outcome",
    [
        (0, 5, [], True, "passed"),
        (1, 5, [], False, "FAILED (exit 1)"),
        (0, 0, [], False, "FAILED (nothing ran)"),  # nothing collected that ran
        (0, 0, [("t", "torchft is not installed")], False, "FAILED (nothing ran)"),  # a tier that vanished
        (0, 0, [("t", "needs a CUDA GPU")] * 3, True, "skipped (needs a CUDA GPU)"),  # the GPU tier here
        (0, 4, [("t", "needs a CUDA GPU")], True, "passed"),
        (0, 4, [("t", "not installed: ip (iproute2)")], False, "passed"),  # a developer's machine
        (0, 4, [("t", "not installed: ip (iproute2)"), ("u", "needs a CUDA GPU")], True, "FAILED (1 skipped in CI)"),
    ],
)
def test_a_group_is_judged_by_what_ran_and_why_the_rest_did_not(rc, ran, skips, ci, outcome):
    assert rs.judge(rc, ran, skips, ci) == outcome


def test_ci_is_read_as_ci_services_set_it():
    assert rs.in_ci({"CI": "true"}) and rs.in_ci({"CI": "1"}) and rs.in_ci({"CI": "True"})
    assert not rs.in_ci({}) and not rs.in_ci({"CI": "false"}) and not rs.in_ci({"CI": ""})


def test_the_end_lists_every_skip_and_marks_those_that_fail_ci(capsys):
    skips = [("cluster", "tests/cluster/test_ssh.py::t1", "not installed: ip"), ("gpu", "g::t", "needs a CUDA GPU")]
    skips.append(("cluster", "tests/cluster/test_ssh.py::t2", "not installed: ip"))
    rs.print_skips(skips, ci=True)
    out = capsys.readouterr().out
    assert "3 skipped (CI=true: only 'needs a CUDA GPU' may skip)" in out
    assert "[cluster] 2 skipped: not installed: ip  FAILS CI" in out
    assert "[gpu] 1 skipped: needs a CUDA GPU\n" in out
    assert "tests/cluster/test_ssh.py::t1" in out and "tests/cluster/test_ssh.py::t2" in out
    rs.print_skips([], ci=False)
    assert "no test was skipped" in capsys.readouterr().out
