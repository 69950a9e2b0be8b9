"""Pure: the broadcast tree's replies merged by content on the way up (``controller_process``) and
unpacked in the notebook as ipyparallel's client does, then spread back per rank (``fanout``)."""

import numpy as np
from ipyparallel.serialize import deserialize_object, serialize_object

from workbench.notebook.cluster.controller_process import COALESCED, merge_replies


def client_unpacks(buffers: list) -> list:
    """What ipyparallel's client does with a coalesced reply's buffers."""
    out = []
    while buffers:
        value, buffers = deserialize_object(buffers)
        out.append(value)
    return out


def per_rank(values: list) -> list:
    head, distinct = values[0], values[1:]
    assert COALESCED in head
    return [distinct[i] for i in head["index"]]


def test_identical_replies_travel_once_and_come_back_per_rank_in_order():
    replies = [(0, None, "quiet")] * 6 + [(1, None, "printed")] + [(0, None, "quiet")]
    leaf0 = merge_replies([serialize_object(r) for r in replies[:4]], merged=False)
    leaf1 = merge_replies([serialize_object(r) for r in replies[4:]], merged=False)
    assert len(leaf0) == 2 and len(leaf1) == 3  # a header, then each distinct reply once
    root = merge_replies([leaf0, leaf1], merged=True)
    values = client_unpacks(list(root))
    assert len(values) == 3  # the header and two distinct replies, for 8 ranks
    assert per_rank(values) == replies


def test_replies_with_buffers_of_their_own_keep_them():
    arrays = [np.arange(4000) * r for r in (1, 1, 2)]  # large enough to travel as buffers
    parts = [serialize_object((0, None, a)) for a in arrays]
    assert all(len(p) > 1 for p in parts)
    root = merge_replies([merge_replies(parts[:2], merged=False), merge_replies(parts[2:], merged=False)], merged=True)
    got = per_rank(client_unpacks(list(root)))
    assert len(got) == 3
    for (_, _, a), want in zip(got, arrays):
        assert np.array_equal(a, want)
