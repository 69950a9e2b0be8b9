"""Auto mode: plain cells run on the ranks without ``%%distrain`` (like ipyparallel's ``%autopx``).

An IPython input transformer rewrites each plain cell into a ``%%distrain_auto`` cell
before IPython reads magics. Cells whose first line is a magic (``%distrain auto
off``, ``%timeit``), a shell escape (``!ls``) or help (``?``) still run in the
notebook, and ``%%local`` runs the rest of its cell there.
"""

from __future__ import annotations

AUTO_MAGIC = "distrain_auto"
MARKER = "[auto] on the ranks (`%distrain auto off` runs cells in the notebook again)"


def _to_ranks(lines: list[str]) -> list[str]:
    """IPython cleanup transformer: send a plain cell to the ranks."""
    first = next((line for line in lines if line.strip()), None)
    if first is None:
        return lines
    head = first.lstrip()
    if head.startswith("%%local"):
        rest = lines[lines.index(first) + 1 :]
        return rest or ["\n"]
    if head.startswith(("%", "!", "?")):
        return lines
    return [f"%%{AUTO_MAGIC}\n", *lines]


def is_on(shell) -> bool:
    return shell is not None and _to_ranks in shell.input_transformers_cleanup


def turn_on(shell) -> bool:
    """Start sending plain cells to the ranks; False where it already was on."""
    if shell is None:
        raise RuntimeError("auto mode needs an IPython shell (a notebook or IPython)")
    if is_on(shell):
        return False
    shell.input_transformers_cleanup.append(_to_ranks)
    return True


def turn_off(shell) -> bool:
    """Run plain cells in the notebook again; False where auto mode was off."""
    if not is_on(shell):
        return False
    shell.input_transformers_cleanup.remove(_to_ranks)
    return True
