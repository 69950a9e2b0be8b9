"""Tier 1: rank selections and sub-command parsing (no processes)."""

import pytest

from workbench.notebook.cluster import format_ranks, parse_ranks
from workbench.notebook.commands import UsageError, dispatch
from workbench.shared.errors import BadRanks


@pytest.mark.parametrize(
    "text, expected",
    [
        (None, [0, 1, 2, 3]),
        ("all", [0, 1, 2, 3]),
        ("2", [2]),
        ("0,2-3", [0, 2, 3]),
        ("3,1", [1, 3]),
    ],
)
def test_parse_ranks(text, expected):
    assert parse_ranks(text, 4) == expected


@pytest.mark.parametrize(
    "text, fragment",
    [
        ("5", "rank(s) 5 do not exist"),
        ("0-x", "bad rank selection"),
        ("3-1", "bad rank selection"),
        ("-1", "bad rank selection"),
    ],
)
def test_bad_ranks_name_the_problem(text, fragment):
    with pytest.raises(BadRanks) as err:
        parse_ranks(text, 4)
    assert fragment in str(err.value)
    assert "0..3" in str(err.value)


def test_format_ranks():
    assert format_ranks([0, 1, 2, 5, 7, 8]) == "0-2,5,7-8"


@pytest.mark.parametrize(
    "line, fragment",
    [
        ("start -n x", "argument -n: expected a whole number"),
        ("start -n 0", "argument -n: expected a whole number >= 1"),
        ("start --backend mpi", "invalid choice"),
        ("start --launcher pbs", "invalid choice"),
        ("start --collective-timeout -3", "argument --collective-timeout: expected a positive number of seconds"),
        ("start --bogus", "unrecognized arguments"),
        ("launch -n 2", "unknown command 'launch'"),
    ],
)
def test_bad_arguments_give_one_line_usage_and_start_nothing(line, fragment):
    from workbench.notebook import api

    before = [(n, s.rankset) for n, s in api.sessions().items()]
    with pytest.raises(UsageError) as err:
        dispatch(line)
    message = str(err.value)
    assert fragment in message
    assert "\n" not in message
    assert [(n, s.rankset) for n, s in api.sessions().items()] == before


def test_commands_on_no_ranks_say_how_to_start():
    from workbench.notebook import session
    from workbench.notebook.cluster import NotRunning

    with session.using(None):
        with pytest.raises(NotRunning, match="distrain start -n"):
            dispatch("status")
