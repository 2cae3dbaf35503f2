"""``WebLoader``: webdataset's loader, run by ``DataLoader2`` with the shardpipes reading services.

The dataset graph runs in ``num_workers`` worker processes (``MultiProcessingReadingService``);
under ``torch.distributed`` the graph's split is applied with the rank as well, without any
``nodesplitter``. Stages chained on the loader (``.unbatched().shuffle(1000).batched(64)``) run
in the main process after the pool. Under DDP the very last stage makes every rank yield the
same number of batches (the ranks agree, in one small gloo collective per 16 batches, to stop
when the first runs out; with a shard index and nothing after the pool, every rank's length
is known and no per-batch collective is needed), so an epoch never hangs a gradient
all-reduce, with or without ``with_epoch``/``ddp_equalize``.

``state_dict()``/``load_state_dict()`` are ``DataLoader2``'s: with a shard index a resumed loader
seeks to where the state was taken, on the same or another number of ranks and workers.
"""

from __future__ import annotations

import sys
import warnings
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any, Literal, cast

import torch
import torch.distributed as dist
from torch.utils.data import IterDataPipe
from torch.utils.data._utils.collate import default_collate, default_convert

from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import FullSync
from shardpipes.datapipes.iter.base import StageIterDataPipe
from shardpipes.errors import ShardpipesWarning
from shardpipes.plan.seeds import buffered_shuffle, derive_seed
from shardpipes.webdataset._stages import Batcher, Collate
from shardpipes.webdataset.pipeline import FluidInterface

__all__ = ["WebLoader"]

_NOT_RESUMABLE = "shardpipes-webloader-not-resumable"


def _distributed() -> bool:
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


class _Items(StageIterDataPipe[Any]):
    """A DataPipe over a loader's one pass, so ``fullsync`` can end the chain."""

    def __init__(self, loader: WebLoader) -> None:
        self.loader = loader

    def __iter__(self) -> Iterator[Any]:
        yield from self.loader._chain()


class _MainShuffle:
    """``loader.shuffle(n)``: a buffered shuffle after the pool, seeded by the loader.

    One object per stage, shared by the loaders ``compose`` makes from it; each call (one pass
    over the loader) takes the next pass number. The seed is derived from the loader's seed,
    the stage's place in the loader's stages, the pass and the rank.
    """

    def __init__(self, seed: int, place: int, size: int) -> None:
        self.seed = seed
        self.place = place
        self.size = size
        self.passes = 0

    def __call__(self, data: Iterator[Any]) -> Iterator[Any]:
        rank = dist.get_rank() if _distributed() else 0
        seed = derive_seed([self.seed, _MAIN_SHUFFLE, self.place, self.passes, rank])
        self.passes += 1
        if self.size <= 1:
            return data
        return buffered_shuffle(data, seed, self.size)


_MAIN_SHUFFLE = 0x57E1  # sets these seeds apart from the plan's


class WebLoader(FluidInterface):
    """webdataset's ``WebLoader(dataset, batch_size=..., num_workers=...)`` on ``DataLoader2``.

    Takes torch ``DataLoader``'s arguments and converts as it does: ``batch_size=None`` hands
    each item to ``collate_fn``, by default torch's ``default_convert`` (numpy arrays become
    tensors; the usual choice when the dataset batches); a ``batch_size`` collates that many
    items with ``collate_fn``, by default ``default_collate``. Chained methods (``unbatched``, ``shuffle``,
    ``batched``, ``map``, ``with_epoch``, ``ddp_equalize``, ...) run in the main process.

    Args:
        dataset: A ``WebDataset``/``DataPipeline`` or any ``IterDataPipe``.
        batch_size: Items per batch made in each worker, or ``None``. Default: ``1``.
        num_workers: Worker processes. Default: ``0`` (in this process).
        collate_fn: Collation of a batch (``batch_size`` set) or conversion of an item
            (``batch_size=None``). Default: torch's ``default_collate`` / ``default_convert``.
        drop_last: Drop each worker's last short batch (not with ``batch_size=None``, as in torch).
        pin_memory: Pin tensors in the main process (when an accelerator exists; torch warns
            and leaves them otherwise).
        timeout: Seconds to wait for a worker's next item; ``0`` waits as long as they live.
        multiprocessing_context: ``"fork"``, ``"spawn"``, ``"forkserver"`` or ``None``.
        prefetch_factor: Items each worker keeps ready; only with workers, as in torch.
            Default: ``2``.
        seed: Loader seed (a new order each epoch from it). Default: the dataset's ``seed``, else ``0``.
        policy: How ranks are equalised: ``"stop"`` (default) or ``"pad"``.
        shuffle: ``True`` is an error, as in torch for an iterable dataset.
        sampler: Must be ``None`` (an iterable dataset has no sampler).
        batch_sampler: Must be ``None``.
        worker_init_fn: Accepted for torch compatibility; not used.
        generator: Accepted for torch compatibility; the loader seeds (``seed``).
        persistent_workers: Keep the worker processes from one epoch to the next (only with
            workers, as in torch). Default ``False``: as torch, each epoch starts new workers
            (the epoch order still follows the loader's seed and epoch number).
    """

    def __init__(
        self,
        dataset: Any,
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: Any = None,
        batch_sampler: Any = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Any = None,
        multiprocessing_context: str | None = None,
        generator: Any = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        seed: int | None = None,
        policy: Literal["stop", "pad"] = "stop",
    ) -> None:
        if shuffle:
            raise ValueError(
                "WebLoader with an iterable dataset: shuffle=True is not possible; use "
                "dataset.shuffle(n) or loader.shuffle(n)"
            )
        if sampler is not None or batch_sampler is not None:
            raise ValueError(
                "WebLoader reads an iterable dataset: sampler and batch_sampler are not used"
            )
        if not isinstance(dataset, IterDataPipe):
            raise TypeError(
                f"WebLoader needs a WebDataset, DataPipeline or IterDataPipe, got {type(dataset).__name__}"
            )
        # torch's checks, with torch's messages
        if num_workers < 0:
            raise ValueError(
                "num_workers option should be non-negative; use num_workers=0 to disable multiprocessing."
            )
        if timeout < 0:
            raise ValueError("timeout option should be non-negative")
        if num_workers == 0 and prefetch_factor is not None:
            raise ValueError(
                "prefetch_factor option could only be specified in multiprocessing."
                "let num_workers > 0 to enable multiprocessing, otherwise set prefetch_factor to None."
            )
        if prefetch_factor is not None and prefetch_factor < 0:
            raise ValueError("prefetch_factor option should be non-negative")
        if persistent_workers and num_workers == 0:
            raise ValueError("persistent_workers option needs num_workers > 0")
        if batch_size is None and drop_last:
            raise ValueError(
                "batch_size=None option disables auto-batching and is mutually exclusive with drop_last"
            )
        if pin_memory and not torch.accelerator.is_available():
            warnings.warn(  # torch's warning, so code that filters it keeps working
                "'pin_memory' argument is set as true but no accelerator is found, "
                "then device pinned memory won't be used.",
                UserWarning,
                stacklevel=2,
            )
        graph = dataset
        if batch_size is not None:
            graph = Collate(  # torch DataLoader's batching, inside the workers
                Batcher(graph, batch_size, not drop_last), collate_fn or default_collate
            )
        else:  # torch DataLoader's batch_size=None: each item through collate_fn
            graph = Collate(graph, collate_fn or default_convert)
        self.dataset = dataset
        self.graph = graph
        self.num_workers = num_workers
        self.multiprocessing_context = multiprocessing_context
        self.prefetch_factor = prefetch_factor if prefetch_factor is not None else 2
        self.persistent_workers = persistent_workers
        self.pin_memory = pin_memory
        self.timeout = timeout
        self.policy = policy
        ds_seed = getattr(dataset, "seed", None)
        self.seed = (
            seed
            if seed is not None
            else (ds_seed if isinstance(ds_seed, int) and ds_seed >= 0 else 0)
        )
        self.pipeline: list[Any] = []
        self.repetitions = 1
        self.nsamples = -1
        self.size: int | None = None
        # One box shared by the loaders compose() makes: they share the workers, and a new pool
        # (persistent_workers=False) is seen by all of them.
        self._box: list[DataLoader2[Any] | None] = [None]
        self._group: Any = None

    def shuffle(self, size: int, **kw: Any) -> Any:
        """Shuffle items in the main process in a buffer of ``size`` (no-op for ``size < 1``).

        Seeded by the loader: its ``seed``, the pass over the loader (a new order each pass,
        the same orders run after run) and the rank. webdataset seeds this shuffle from the
        time and the process id (another order every run); ``rng=``/``seed=`` seed it as in
        webdataset.
        """
        if size < 1:
            return self
        if kw.get("rng") is not None or kw.get("seed") is not None:
            return super().shuffle(size, **kw)
        return self.compose(_MainShuffle(self.seed, len(self.pipeline), size))

    def compose(self, *args: Any) -> WebLoader:
        """A loader with ``args`` appended to its main-process stages (shares the worker pool)."""
        result = object.__new__(WebLoader)
        result.__dict__.update(self.__dict__)
        result.pipeline = [*self.pipeline, *args]
        return result

    def _dataloader(self) -> DataLoader2[Any]:
        if self._box[0] is None:
            mp = MultiProcessingReadingService(
                num_workers=self.num_workers,
                multiprocessing_context=self.multiprocessing_context,
                worker_prefetch_cnt=self.prefetch_factor,
                pin_memory=self.pin_memory,
                timeout=self.timeout,
            )
            # With nothing after the pool the reading service evens out the ranks itself (from
            # the index when there is one): what the loader yields is then what it counts, and
            # its state names the position exactly.
            ranks = DistributedReadingService(equalize=self._plain(), policy=self.policy)
            rs = SequentialReadingService(ranks, mp) if _distributed() else mp
            loader = DataLoader2(self.graph, reading_service=rs)
            loader.seed(self.seed)
            self._box[0] = loader
        return cast(DataLoader2[Any], self._box[0])

    def _epoch(self) -> Iterator[Any]:
        """One loader epoch; without ``persistent_workers`` the workers end with it, as in torch."""
        loader = self._dataloader()
        yield from loader
        if self.num_workers > 0 and not self.persistent_workers:
            # The next epoch starts new workers; the state carries the seed and epoch number,
            # so it continues the loader's sequence of epochs instead of repeating the first.
            state = loader.state_dict()
            loader.shutdown()
            self._box[0] = None
            self._dataloader().load_state_dict(state)

    def _chain(self) -> Iterator[Any]:
        """One pass: a loader epoch (or, with ``with_epoch``/``repeat``, as many as it takes)."""

        def one_epoch() -> Iterator[Any]:
            it: Any = self._epoch()
            for stage in self.pipeline:
                it = stage(iter(it))
            return cast(Iterator[Any], it)

        if self.repetitions == 1:
            yield from one_epoch()
            return

        def passes() -> Iterator[Any]:
            for _ in range(self.repetitions):
                count = 0
                for item in one_epoch():
                    count += 1
                    yield item
                if count == 0:
                    break

        yield from islice(passes(), self.nsamples) if self.nsamples > 0 else passes()

    def _plain(self) -> bool:
        """Whether the loader yields the reading service's items as they are (no stage after the pool)."""
        return not self.pipeline and self.repetitions == 1

    def state_dict(self) -> dict[str, Any]:
        """The position of this loader (``DataLoader2.state_dict``): save it with the model.

        With stages after the worker pool (``loader.unbatched().shuffle(...)``, ``with_epoch``,
        ``ddp_equalize``), which hold items in the main process that a position cannot name,
        the state only says so (with a warning now), and :meth:`load_state_dict` refuses it: a
        checkpoint (Lightning's too) can still be written, and is never resumed wrongly.
        """
        why = self._not_resumable()
        if why is not None:
            warnings.warn(f"WebLoader.state_dict(): {why}", ShardpipesWarning, stacklevel=2)
            return {"format": _NOT_RESUMABLE, "reason": why}
        return self._dataloader().state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` at the next ``iter()`` (``DataLoader2.load_state_dict``).

        Raises:
            ValueError: The state, or this loader, has stages after the worker pool (see
                :meth:`state_dict`); or ``DataLoader2.load_state_dict`` refuses it, saying why.
        """
        why = state.get("reason") if state.get("format") == _NOT_RESUMABLE else None
        why = why or self._not_resumable()
        if why is not None:
            raise ValueError(f"WebLoader.load_state_dict(): cannot resume: {why}")
        self._dataloader().load_state_dict(state)

    def _not_resumable(self) -> str | None:
        if self._plain():
            return None
        return (
            "the loader has stages after the worker pool (loader.unbatched()/shuffle()/"
            "batched()/map(), with_epoch, repeat or ddp_equalize), which run in the main "
            "process and hold items a saved position cannot name; put them on the dataset "
            "(they then run in the workers and resume)"
        )

    def __iter__(self) -> Iterator[Any]:
        if not _distributed() or self._plain():
            yield from self._chain()
            return
        if self._group is None:
            # Our own gloo group: the equalising collectives never interleave with training's.
            self._group = dist.new_group(backend="gloo")
        sync = FullSync(_Items(self), policy=self.policy)
        sync.set_process_group(self._group)
        yield from sync

    def __len__(self) -> int:
        if self.size is None:
            raise TypeError(
                "WebLoader instance doesn't have valid length (use with_length or ddp_equalize)"
            )
        return self.size

    def with_length(self, n: int, silent: bool = False) -> WebLoader:
        """Set ``len()`` to ``n``."""
        self.size = n
        return self

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> WebLoader:
        """Make each pass exactly ``n`` items on every rank, starting new loader epochs as needed."""
        self.repetitions = sys.maxsize
        self.nsamples = max(nsamples, nbatches)
        return self

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> WebLoader:
        """Repeat ``nepochs`` loader epochs per pass (for ever if ``<= 0``), at most ``nbatches`` items."""
        self.repetitions = nepochs if nepochs > 0 else sys.maxsize
        self.nsamples = nbatches
        return self

    def ddp_equalize(self, length: int, with_length: bool = True) -> WebLoader:
        """``length`` batches in total per epoch, split equally: ``length // world_size`` on each rank.

        As webdataset 0.1's: the data repeats as needed to fill the count, and ``len()`` gives it.
        """
        world = dist.get_world_size() if _distributed() else 1
        per_rank = length // world
        result = self.compose()
        result.repetitions = sys.maxsize
        result.nsamples = per_rank
        if with_length:
            result.size = per_rank
        return result

    def shutdown(self) -> None:
        """Stop the worker processes."""
        if self._box[0] is not None:
            self._box[0].shutdown()
            self._box[0] = None
