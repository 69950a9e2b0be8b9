"""Bundled text, a byte-level tokenizer, datasets and a deterministic data-parallel batcher.

Nothing is downloaded: the corpus ships in ``workbench/models/data/*.txt``.

The batcher is what makes N-rank training reproduce 1-rank training: global batch ``k``
is the same set of examples for every ``dp_size``, and rank ``r`` takes the ``r``-th
contiguous slice of it, so concatenating the ranks' batches in rank order gives back the
single-rank batch exactly.
"""

from __future__ import annotations

from collections.abc import Iterator
from importlib import resources

import torch

__all__ = [
    "encode",
    "decode",
    "load_corpus",
    "corpus_files",
    "TextDataset",
    "SyntheticDataset",
    "batch_at",
    "batches",
    "IGNORE_INDEX",
]

IGNORE_INDEX = -100
VOCAB = 256


# Tokenizer ------------------------------------------------------------------------------
def encode(text: str) -> torch.Tensor:
    """UTF-8 bytes as token ids (vocab 256)."""
    return torch.tensor(list(text.encode("utf-8")), dtype=torch.long)


def decode(tokens) -> str:
    """Inverse of :func:`encode`; invalid UTF-8 (a sampled half-character) is replaced."""
    if isinstance(tokens, torch.Tensor):
        tokens = tokens.flatten().tolist()
    return bytes(int(t) for t in tokens).decode("utf-8", errors="replace")


# Corpus ---------------------------------------------------------------------------------
def corpus_files() -> list[str]:
    root = resources.files("workbench.models") / "data"
    return sorted(p.name for p in root.iterdir() if p.name.endswith(".txt") and p.name != "README.txt")


def load_corpus(names: list[str] | None = None) -> str:
    """The bundled public-domain texts, concatenated (see ``data/README.txt``)."""
    root = resources.files("workbench.models") / "data"
    names = names or corpus_files()
    return "\n\n".join((root / n).read_text(encoding="utf-8") for n in names)


class TextDataset(torch.utils.data.Dataset):
    """Next-byte prediction windows: item ``i`` is ``(x, y)`` with ``y = x`` shifted by one.

    Windows start every ``stride`` bytes (default ``seq_len``: non-overlapping).
    """

    def __init__(self, seq_len: int, text: str | None = None, stride: int | None = None):
        self.seq_len = seq_len
        self.stride = stride or seq_len
        self.tokens = encode(load_corpus() if text is None else text)
        n = (len(self.tokens) - seq_len - 1) // self.stride + 1
        if n < 1:
            raise ValueError(f"text of {len(self.tokens)} bytes is too short for seq_len={seq_len}")
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int):
        s = i * self.stride
        w = self.tokens[s : s + self.seq_len + 1]
        return w[:-1], w[1:]


class SyntheticDataset(torch.utils.data.Dataset):
    """Small algorithmic tasks with a known answer; only answer positions are scored.

    - ``copy``:    ``a_1..a_n SEP a_1..a_n``  (tokens 0..253; SEP=254)
    - ``reverse``: ``a_1..a_n SEP a_n..a_1``
    - ``modadd``:  ``a + b = c`` as tokens ``[a, 254, b, 255, c]`` with ``c = (a+b) mod p``
      (Power et al. 2022, "Grokking"); ``p <= 254``.
    """

    SEP, EQ = 254, 255

    def __init__(self, kind: str = "copy", n: int = 1024, seq_len: int = 16, seed: int = 0, p: int = 97):
        if kind not in ("copy", "reverse", "modadd"):
            raise ValueError(f"unknown task {kind!r}: use 'copy', 'reverse' or 'modadd'")
        g = torch.Generator().manual_seed(seed)
        if kind == "modadd":
            if not 2 <= p <= 254:
                raise ValueError(f"p={p} must be in 2..254")
            a = torch.randint(0, p, (n,), generator=g)
            b = torch.randint(0, p, (n,), generator=g)
            seq = torch.stack([a, torch.full_like(a, self.SEP), b, torch.full_like(a, self.EQ), (a + b) % p], 1)
            answer_from = 4
        else:
            half = seq_len // 2
            a = torch.randint(0, 254, (n, half), generator=g)
            tail = a if kind == "copy" else a.flip(1)
            seq = torch.cat([a, torch.full((n, 1), self.SEP), tail], 1)
            answer_from = half + 1
        self.kind = kind
        self.x = seq[:, :-1].contiguous()
        y = seq[:, 1:].clone()
        y[:, : answer_from - 1] = IGNORE_INDEX
        self.y = y

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return self.x[i], self.y[i]


# Data-parallel batching -----------------------------------------------------------------
def _order(n: int, seed: int, epoch: int) -> torch.Tensor:
    return torch.randperm(n, generator=torch.Generator().manual_seed(seed * 100003 + epoch))


def batch_at(dataset, batch_size: int, step: int, *, dp_rank: int = 0, dp_size: int = 1, seed: int = 0):
    """Rank ``dp_rank``'s share of global batch ``step`` as stacked ``(x, y)``.

    ``batch_size`` is the GLOBAL batch; each rank gets ``batch_size // dp_size`` examples.
    Epochs reshuffle with ``seed``; a partial last batch of an epoch is dropped.
    """
    if dp_size < 1 or not 0 <= dp_rank < dp_size:
        raise ValueError(f"dp_rank={dp_rank} is not in 0..dp_size-1 (dp_size={dp_size})")
    if batch_size % dp_size:
        ok = [b for b in range(dp_size, 2 * batch_size + dp_size, dp_size)][:3]
        raise ValueError(
            f"global batch_size={batch_size} does not split over dp_size={dp_size}; use a multiple of {dp_size}, e.g. {ok}"
        )
    n = len(dataset)
    per_epoch = n // batch_size
    if per_epoch < 1:
        raise ValueError(f"dataset of {n} examples is smaller than batch_size={batch_size}")
    epoch, k = divmod(step, per_epoch)
    local = batch_size // dp_size
    idx = _order(n, seed, epoch)[k * batch_size + dp_rank * local : k * batch_size + (dp_rank + 1) * local]
    xs, ys = zip(*(dataset[int(i)] for i in idx))
    return torch.stack(xs), torch.stack(ys)


def batches(
    dataset,
    batch_size: int,
    dp_rank: int = 0,
    dp_size: int = 1,
    seed: int = 0,
    *,
    steps: int | None = None,
    start: int = 0,
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Iterate :func:`batch_at` from ``start`` (``steps`` batches, or forever)."""
    step = start
    while steps is None or step < start + steps:
        yield batch_at(dataset, batch_size, step, dp_rank=dp_rank, dp_size=dp_size, seed=seed)
        step += 1
