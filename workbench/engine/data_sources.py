"""Where the trainer's batches come from, and how far into them a run is (rank side).

``Trainer(data=...)`` takes a function of the micro-batch index, a map-style ``Dataset``
(sharded here over the data-parallel ranks), a ``DataLoader`` or any other iterable (the
forms users read in docs/strategies.md). Every source reports its position as JSON
(:meth:`DataSource.state`), so a checkpoint resumes the data where the run left it."""

from __future__ import annotations

import itertools
from typing import Any

import torch

__all__ = ["DataSource", "DataExhausted", "make_source"]


class DataExhausted(Exception):
    """A one-shot iterator ran out of batches (the run finishes there)."""


class DataSource:
    """``batch(micro)`` -> the batch for micro-batch ``micro`` on this rank; ``state``/``restore``."""

    kind = "?"
    pure = False  # batch(micro) depends on micro alone (no iterator to advance)
    _peeked: tuple | None = None

    def batch(self, micro: int):
        raise NotImplementedError

    def peek(self, micro: int):
        """Batch ``micro`` without consuming it (an iterator's is kept for :meth:`take`)."""
        if self.pure:
            return self.batch(micro)
        if self._peeked is None:
            self._peeked = (self.batch(micro),)
        return self._peeked[0]

    def take(self, micro: int):
        """The batch for micro-batch ``micro`` (the peeked one first)."""
        if self._peeked is not None:
            (b,), self._peeked = self._peeked, None
            return b
        return self.batch(micro)

    def state(self, micro: int) -> dict:
        """The position after ``micro`` micro-batches were consumed (JSON)."""
        return {"kind": self.kind, "micro_batch": int(micro)}

    def restore(self, micro: int, state: dict) -> str | None:
        """Continue after ``micro`` micro-batches; returns a note where that cannot be exact."""
        self._peeked = None
        return self._restore(micro, state)

    def _restore(self, micro: int, state: dict) -> str | None:
        return None

    def _consumed(self) -> int:
        """Batches of this epoch handed to the trainer (one taken only to be peeked at is not)."""
        return self.taken - (self._peeked is not None)

    def describe(self) -> str:
        return self.kind


class FunctionSource(DataSource):
    kind = "function"
    pure = True

    def __init__(self, fn):
        self.fn = fn

    def batch(self, micro: int):
        return self.fn(micro)


class DatasetSource(DataSource):
    """A map-style dataset sharded over the data-parallel ranks (``batch_size``: the global
    micro-batch). Epoch ``e`` is one permutation seeded ``seed + e`` on every rank, cut into
    global batches (an incomplete last one dropped, so every rank steps alike); rank ``r``
    takes the ``r``-th slice of each, so the ranks' slices in order are the 1-rank batch. A
    pure function of the micro-batch index, hence resumable exactly."""

    kind = "dataset"
    pure = True

    def __init__(
        self, dataset, *, batch_size: int, dp_rank: int, dp_size: int, shuffle: bool, seed: int, collate_fn=None
    ):
        n = len(dataset)
        if batch_size % dp_size:
            raise ValueError(
                f"batch_size={batch_size} (the global micro-batch) must divide by the {dp_size} "
                f"data-parallel ranks: e.g. batch_size={max(dp_size, batch_size // dp_size * dp_size)}"
            )
        if n < batch_size:
            raise ValueError(
                f"the dataset holds {n} samples, fewer than one global batch of {batch_size}: "
                f"use batch_size <= {n // dp_size * dp_size or dp_size}"
            )
        from torch.utils.data import default_collate

        self.dataset, self.n, self.batch_size = dataset, n, batch_size
        self.dp_rank, self.dp_size, self.shuffle, self.seed = dp_rank, dp_size, shuffle, seed
        self.per_rank = batch_size // dp_size
        self.per_epoch = n // batch_size
        self.collate = collate_fn or default_collate
        self._perm: tuple[int, torch.Tensor] | None = None

    def _order(self, epoch: int) -> torch.Tensor:
        if self._perm is None or self._perm[0] != epoch:
            if self.shuffle:
                g = torch.Generator().manual_seed(self.seed + epoch)
                self._perm = (epoch, torch.randperm(self.n, generator=g))
            else:
                self._perm = (epoch, torch.arange(self.n))
        return self._perm[1]

    def indices(self, micro: int) -> list[int]:
        """The dataset indices of this rank's share of global micro-batch ``micro``."""
        epoch, j = divmod(micro, self.per_epoch)
        start = j * self.batch_size + self.dp_rank * self.per_rank
        return self._order(epoch)[start : start + self.per_rank].tolist()

    def batch(self, micro: int):
        return self.collate([self.dataset[i] for i in self.indices(micro)])

    def state(self, micro: int) -> dict:
        epoch, j = divmod(micro, self.per_epoch)
        return {
            "kind": self.kind,
            "micro_batch": int(micro),
            "epoch": epoch,
            "batch_in_epoch": j,
            "seed": self.seed,
            "shuffle": self.shuffle,
            "batch_size": self.batch_size,
            "samples": self.n,
        }

    def _restore(self, micro: int, state: dict) -> str | None:
        changed = [
            k
            for k in ("seed", "shuffle", "batch_size", "samples")
            if k in state and state[k] != getattr(self, "n" if k == "samples" else k)
        ]
        if changed:
            return (
                "data: the dataset's "
                + ", ".join(f"{k} was {state[k]}" for k in changed)
                + " when saved; the run continues at micro-batch "
                f"{micro} of the order as it is now (not the saved one)"
            )
        return None

    def describe(self) -> str:
        return (
            f"dataset of {self.n} samples, global batch {self.batch_size} = {self.per_rank} x {self.dp_size} "
            f"data-parallel ranks, {self.per_epoch} batches an epoch, "
            + (f"shuffled (seed {self.seed} + epoch)" if self.shuffle else "in order")
        )


class _ShardBatches:
    """A batch sampler yielding base batches ``i`` with ``i % size == rank``, from this rank's
    batch ``skip`` on; ``len(base) // size`` of them an epoch on every rank (ranks step alike)."""

    def __init__(self, base, rank: int, size: int, skip: int):
        self.base, self.rank, self.size, self.skip = base, rank, size, skip
        self.per_epoch = len(base) // size

    def __iter__(self):
        mine = itertools.islice(self.base, self.rank, None, self.size)
        return itertools.islice(mine, self.skip, self.per_epoch)

    def __len__(self) -> int:
        return max(0, self.per_epoch - self.skip)


class LoaderSource(DataSource):
    """A ``DataLoader`` over a map-style dataset, sharded by batches: batch ``i`` goes to
    data-parallel rank ``i % dp_size`` (as Accelerate's default), its ``RandomSampler``
    re-seeded ``seed + epoch`` so the ranks agree on the order; a restore skips the batches
    taken at the sampler, without loading them. A ``DistributedSampler`` loader is taken as
    already sharded (``set_epoch`` is called)."""

    kind = "dataloader"

    def __init__(self, loader, *, dp_rank: int, dp_size: int, seed: int):
        from torch.utils.data import DistributedSampler, RandomSampler

        self.loader, self.seed = loader, seed
        self.presharded = isinstance(loader.sampler, DistributedSampler)
        self.rank, self.size = (0, 1) if self.presharded else (dp_rank, dp_size)
        self.random = isinstance(loader.sampler, RandomSampler)
        self.epoch, self.taken = 0, 0  # batches taken by this rank in this epoch
        self.per_epoch = len(_ShardBatches(loader.batch_sampler, self.rank, self.size, 0))
        if self.per_epoch < 1:
            raise ValueError(
                f"the DataLoader gives {len(loader.batch_sampler)} batches, fewer than the "
                f"{dp_size} data-parallel ranks: each rank needs at least one"
            )
        self._it = None

    def _open(self, epoch: int, skip: int):
        from torch.utils.data import DataLoader

        self.epoch, self.taken = epoch, skip
        sampler = self.loader.batch_sampler
        if self.presharded:
            self.loader.sampler.set_epoch(epoch)
        elif self.random:  # the same order on every rank, a new one each epoch
            gen = self.loader.sampler.generator
            if gen is None:
                gen = self.loader.sampler.generator = torch.Generator()
            gen.manual_seed(self.seed + epoch)
        ld = self.loader
        kwargs = dict(
            num_workers=ld.num_workers,
            collate_fn=ld.collate_fn,
            pin_memory=ld.pin_memory,
            timeout=ld.timeout,
            worker_init_fn=ld.worker_init_fn,
            multiprocessing_context=ld.multiprocessing_context,
            generator=ld.generator,
            persistent_workers=False,
        )
        if ld.num_workers:
            kwargs["prefetch_factor"] = ld.prefetch_factor
        self._it = iter(
            DataLoader(ld.dataset, batch_sampler=_ShardBatches(sampler, self.rank, self.size, skip), **kwargs)
        )

    def batch(self, micro: int):
        if self._it is None:
            self._open(self.epoch, self.taken)
        try:
            b = next(self._it)
        except StopIteration:
            self._open(self.epoch + 1, 0)
            b = next(self._it)
        self.taken += 1
        return b

    def state(self, micro: int) -> dict:
        return {
            "kind": self.kind,
            "micro_batch": int(micro),
            "epoch": self.epoch,
            "batch_in_epoch": self._consumed(),
            "seed": self.seed,
        }

    def _restore(self, micro: int, state: dict) -> str | None:
        if state.get("kind") == self.kind and "epoch" in state:
            epoch, taken = int(state["epoch"]), int(state["batch_in_epoch"])
        else:  # saved from another kind of source: place by the micro-batch count
            epoch, taken = divmod(micro, self.per_epoch)
        self._open(epoch, taken)
        return None

    def describe(self) -> str:
        how = (
            "already sharded (DistributedSampler)"
            if self.presharded
            else f"batch i to data-parallel rank i % {self.size}"
        )
        return f"DataLoader of {len(self.loader.batch_sampler)} batches, {how}, {self.per_epoch} batches an epoch here"


class IterableSource(DataSource):
    """Any other iterable: batches as given (already this rank's). A re-iterable one starts
    over at the end of a pass and is restored by re-iterating and skipping; a one-shot
    iterator cannot be rewound and ends the run when exhausted."""

    kind = "iterable"

    def __init__(self, iterable):
        self.iterable = iterable
        self._it = iter(iterable)
        self.reiterable = self._it is not iterable
        self.epoch, self.taken = 0, 0

    def batch(self, micro: int):
        try:
            b = next(self._it)
        except StopIteration:
            if not self.reiterable:
                raise DataExhausted(f"the data iterator ran out after {self.taken} batches") from None
            self._it, self.epoch, self.taken = iter(self.iterable), self.epoch + 1, 0
            try:
                b = next(self._it)
            except StopIteration:
                raise DataExhausted("the data iterable gives no batches") from None
        self.taken += 1
        return b

    def state(self, micro: int) -> dict:
        return {"kind": self.kind, "micro_batch": int(micro), "epoch": self.epoch, "batch_in_epoch": self._consumed()}

    def _restore(self, micro: int, state: dict) -> str | None:
        if not self.reiterable:
            return (
                "data: a one-shot iterator cannot be rewound; it continues where it is "
                "(pass a Dataset, a DataLoader or a function of the micro-batch index for exact resumption)"
            )
        epoch = int(state.get("epoch", 0)) if state.get("kind") == self.kind else 0
        taken = int(state.get("batch_in_epoch", micro)) if state.get("kind") == self.kind else micro
        self._it, self.epoch, self.taken = iter(self.iterable), epoch, 0
        for _ in range(taken):  # re-iterate to the position (the iterable's own order is assumed stable)
            self.batch(0)
        return None

    def describe(self) -> str:
        return "iterable (re-iterated each pass)" if self.reiterable else "one-shot iterator"


def make_source(
    data: Any, *, batch_size: int | None, dp_rank: int, dp_size: int, shuffle: bool, seed: int, collate_fn=None
) -> DataSource:
    """The :class:`DataSource` for what the user passed as ``data``; a clear error for anything else."""
    from torch.utils.data import DataLoader, Dataset, IterableDataset

    if isinstance(data, DataSource):
        return data
    if isinstance(data, DataLoader):
        if batch_size is not None:
            raise ValueError("batch_size= is for a Dataset; a DataLoader has its own (set it on the loader)")
        if isinstance(data.dataset, IterableDataset) or data.batch_sampler is None:
            return IterableSource(data)
        return LoaderSource(data, dp_rank=dp_rank, dp_size=dp_size, seed=seed)
    map_style = (isinstance(data, Dataset) and not isinstance(data, IterableDataset)) or (
        hasattr(data, "__getitem__") and hasattr(data, "__len__") and batch_size is not None
    )
    if map_style:
        if batch_size is None:
            raise ValueError(
                f"data is a {type(data).__name__} (a Dataset): give batch_size= (the global micro-batch "
                f"over the {dp_size} data-parallel ranks), e.g. Trainer(..., data=ds, batch_size={8 * dp_size})"
            )
        return DatasetSource(
            data,
            batch_size=batch_size,
            dp_rank=dp_rank,
            dp_size=dp_size,
            shuffle=shuffle,
            seed=seed,
            collate_fn=collate_fn,
        )
    if batch_size is not None:
        raise ValueError(f"batch_size= is for a Dataset; data is a {type(data).__name__}")
    if callable(data) and not hasattr(data, "__next__"):
        return FunctionSource(data)
    if hasattr(data, "__iter__") or hasattr(data, "__next__"):
        return IterableSource(data)
    raise TypeError(
        f"data is a {type(data).__name__}: the trainer takes a function micro_batch_index -> batch, "
        "an iterable of batches, a torch Dataset (with batch_size=) or a DataLoader"
    )
