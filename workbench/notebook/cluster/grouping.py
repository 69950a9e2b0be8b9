"""Output that reads at any rank count: identical text from several ranks shown once under its ranks.

As ``dshbak -c`` does for pdsh: ``[ranks 0-13,15] text`` for what those ranks printed alike,
``[rank 14] text`` for a rank that printed something else. Used for cell output, tracebacks and
``%distrain where``. Small sets keep one block per rank (what a reader of 2-8 ranks expects);
past ``GROUP_PAST`` ranks grouping is the default, and either way can be asked for.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Hashable, Iterable
from typing import TypeVar

from ...shared.ranges import format_ranks

GROUP_PAST = 8  # rank sets larger than this show identical output once under its ranks

T = TypeVar("T")


def grouped_by_default(n_ranks: int) -> bool:
    return n_ranks > GROUP_PAST


def resolve(group: bool | None, n_ranks: int) -> bool:
    """``group``: True/False as asked (``--grouped`` / ``--per-rank``), None: by the set's size."""
    return grouped_by_default(n_ranks) if group is None else bool(group)


def label(ranks: Iterable[int]) -> str:
    """'rank 3' or 'ranks 0-13,15'."""
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {format_ranks(ranks)}"


def tag_ranks(ranks: Iterable[int], text: str) -> str:
    """Every line of ``text`` under its ranks' label."""
    head = f"[{label(ranks)}] "
    return "".join(f"{head}{line}\n" for line in text.splitlines())


def group_identical(
    items: Iterable[tuple[int, T]], key: Callable[[T], Hashable] | None = None
) -> list[tuple[list[int], T]]:
    """(ranks, value) per distinct value, in the order each value was first seen.

    ``key`` maps a value to what makes two of them "the same" (default: the value itself).
    """
    groups: dict[Hashable, tuple[list[int], T]] = {}
    for rank, value in items:
        k = value if key is None else key(value)
        if k in groups:
            groups[k][0].append(rank)
        else:
            groups[k] = ([rank], value)
    return list(groups.values())


def bundle_key(item: dict) -> str:
    """Two display bundles are the same when their data and metadata are."""
    return json.dumps([item.get("data", {}), item.get("metadata", {})], sort_keys=True, default=str)
