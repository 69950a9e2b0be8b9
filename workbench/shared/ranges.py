"""Parsing of rank selections such as ``0,2-3`` or ``all``."""

from __future__ import annotations

from .errors import BadRanks


def parse_ranks(text: str | None, world_size: int) -> list[int]:
    """Return the sorted ranks named by ``text`` (``None``/``all`` means every rank).

    Raises ValueError naming the bad part and the valid range, so that a typo never
    runs a cell on the wrong ranks.
    """
    if text is None or str(text).strip().lower() in ("", "all"):
        return list(range(world_size))
    if isinstance(text, int):
        text = str(text)
    if isinstance(text, (list, tuple)):
        text = ",".join(str(t) for t in text)
    ranks: set[int] = set()
    for part in str(text).split(","):
        part = part.strip()
        if not part:
            continue
        try:
            if "-" in part:
                lo_s, hi_s = part.split("-", 1)
                lo, hi = int(lo_s), int(hi_s)
                if hi < lo:
                    raise ValueError
                ranks.update(range(lo, hi + 1))
            else:
                ranks.add(int(part))
        except ValueError:
            raise BadRanks(
                f"bad rank selection {part!r} in {text!r}: use 'all', a rank like 2, "
                f"a list like 0,2 or a range like 1-3 (ranks are 0..{world_size - 1})"
            ) from None
    bad = sorted(r for r in ranks if r < 0 or r >= world_size)
    if bad:
        raise BadRanks(f"rank(s) {', '.join(map(str, bad))} do not exist: this rank set has ranks 0..{world_size - 1}")
    if not ranks:
        raise BadRanks(f"no ranks selected by {text!r}: use 'all' or ranks 0..{world_size - 1}")
    return sorted(ranks)


def format_ranks(ranks: list[int]) -> str:
    """Compact form of a rank list: [0,1,2,5] -> '0-2,5'."""
    out: list[str] = []
    ranks = sorted(ranks)
    i = 0
    while i < len(ranks):
        j = i
        while j + 1 < len(ranks) and ranks[j + 1] == ranks[j] + 1:
            j += 1
        out.append(str(ranks[i]) if i == j else f"{ranks[i]}-{ranks[j]}")
        i = j + 1
    return ",".join(out)


def ranks_phrase(ranks: list[int]) -> str:
    """'rank 1' or 'ranks 0, 2, 3', for messages."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return "ranks " + ", ".join(map(str, ranks))
