"""A plain ``DataLoader2`` handed straight to a real Lightning ``Trainer`` resumes exactly (issue 41).

``Trainer.fit(model, train_dataloaders=dl)``, a checkpoint every 7 steps and one at the end of
the first epoch (80 samples in batches of 4: 20 steps), then ``fit(..., ckpt_path=...)``: the
resumed run takes exactly the batches of a run without a stop. With a shard index the loader has
a length (``len(dl)``), so Lightning does not fetch ahead; without one Lightning fetches one batch
ahead and the loader's state is that of the batches the steps took (``dataloader2/_consumers.py``).
On 2 gloo ranks Lightning writes rank 0's checkpoint only, and every rank's state is in it.
"""

from __future__ import annotations

import logging
import os
import warnings

import pytest
import torch

from _dist import run_ranks
from _graphs import id_graph
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic
from test_examples import require

L = pytest.importorskip("lightning")

SAMPLES, BATCH = 80, 4


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """80 samples in 4 shards of 20, with their index (2 ranks split them evenly without it too)."""
    paths = write_synthetic(tmp_path_factory.mktemp("lt"), shards=4, samples=20, payload_bytes=8)
    build_index(paths, progress=False).save(default_index_url(paths))
    return paths


class Model(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(1, 1)
        self.seen: list[list[int]] = []

    def training_step(self, batch, batch_idx):
        self.seen.append([int(x) for x in batch])
        return self.linear(torch.ones(len(batch), 1)).square().mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


def _loader(paths, *, index: bool, workers: int, ranks: bool = False) -> DataLoader2:
    services = [DistributedReadingService(timeout=60)] if ranks else []
    if workers:
        services.append(MultiProcessingReadingService(num_workers=workers))
    rs = SequentialReadingService(*services) if len(services) > 1 else (services or [None])[0]
    dl = DataLoader2(id_graph(paths, index=index, batch_size=BATCH), reading_service=rs)
    dl.seed(5)
    return dl


def _fit(folder, paths, steps, *, index, workers, resume=None, ranks=False, devices=1):
    """The batches of one ``Trainer.fit``: checkpoints every 7 steps, and at each epoch's end."""
    epoch = SAMPLES // BATCH // devices
    save = [
        L.pytorch.callbacks.ModelCheckpoint(folder, every_n_train_steps=7, save_top_k=-1),
        L.pytorch.callbacks.ModelCheckpoint(
            f"{folder}/end", every_n_train_steps=epoch, save_top_k=-1
        ),
    ]
    trainer = L.Trainer(
        accelerator="cpu",
        devices=devices,
        strategy="ddp" if ranks else "auto",
        max_steps=steps,
        callbacks=save,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Model()
    dl = _loader(paths, index=index, workers=workers, ranks=ranks)
    try:
        trainer.fit(model, train_dataloaders=dl, ckpt_path=resume)
    finally:
        dl.shutdown()
    return model.seen


def _runs(tmp, paths, **kw):
    """An uninterrupted run of 2 epochs, and the runs resumed at step 7 and at the first epoch's end."""
    epoch = SAMPLES // BATCH // kw.get("devices", 1)
    whole = _fit(f"{tmp}/whole", paths, 2 * epoch, **kw)
    head = _fit(f"{tmp}/ckpt", paths, epoch, **kw)
    at7 = _fit(f"{tmp}/r7", paths, 2 * epoch, resume=f"{tmp}/ckpt/epoch=0-step=7.ckpt", **kw)
    end = _fit(
        f"{tmp}/end", paths, 2 * epoch, resume=f"{tmp}/ckpt/end/epoch=0-step={epoch}.ckpt", **kw
    )
    return whole, head, at7, end


def _quiet():
    logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
    warnings.filterwarnings("ignore", module="lightning")  # its tips and deprecations


@pytest.mark.parametrize(
    ("index", "workers"),
    [(False, 2), (True, 2), pytest.param(False, 0, marks=pytest.mark.slow)],
    ids=["no-index-2-workers", "index-2-workers", "no-index-in-process"],
)
def test_a_plain_dataloader2_resumes_exactly_under_a_trainer(tmp_path, shards, index, workers):
    require("lightning")
    _quiet()
    whole, head, at7, at20 = _runs(tmp_path, shards, index=index, workers=workers)
    with _loader(shards, index=index, workers=workers) as dl:
        plain = [[int(x) for x in b] for b in dl]
    assert whole[:20] == plain  # Lightning's first epoch is the loader's (seed 5, epoch 0)
    first = [x for b in whole[:20] for x in b]
    assert sorted(first) == list(range(SAMPLES))  # an epoch: 80 of 80
    assert head == whole[:20]
    resumed = head[:7] + at7[:13]
    assert sorted(x for b in resumed for x in b) == list(range(SAMPLES))  # none twice, none missed
    assert head[:7] + at7 == whole  # the very batches of the run without a stop
    assert at20 == whole[20:]  # resumed at the epoch's end: the next epoch, whole


@pytest.mark.parametrize(
    ("policy", "drop_last", "workers"),
    [("drop", False, 0), ("drop", True, 2), ("pad", False, 2), ("pad", True, 0)],
)
def test_len_is_the_batches_an_epoch_yields(tmp_path, policy, drop_last, workers):
    # 7 + 11 + 13 = 31 samples: uneven for 2 readers, and batches of 4 leave a partial one.
    paths = write_synthetic(tmp_path, shards=3, samples=[7, 11, 13], payload_bytes=8)
    build_index(paths, progress=False).save(default_index_url(paths))
    graph = (
        IterableWrapper(paths)
        .shuffle()
        .sharding_by_index(policy=policy)
        .open_files_by_fsspec()
        .load_from_tar()
        .webdataset()
        .batch(4, drop_last=drop_last)
    )
    rs = MultiProcessingReadingService(num_workers=workers) if workers else None
    with DataLoader2(graph, reading_service=rs) as dl:
        dl.seed(1)
        before = len(dl)
        assert before == sum(1 for _ in dl) == len(dl)  # the same every epoch
        assert before == sum(1 for _ in dl)


def test_len_without_an_exact_length_is_a_type_error(shards):
    assert len(_loader(shards, index=True, workers=2)) == SAMPLES // BATCH
    assert len(DataLoader2(IterableWrapper(range(10)).batch(4))) == 3  # in-process, torch's len
    with pytest.raises(TypeError, match="doesn't have valid length"):
        len(_loader(shards, index=False, workers=2))
    with pytest.raises(TypeError, match="doesn't have valid length"):
        len(_loader(shards, index=False, workers=0))  # in-process, but the tar stages have none


def rank_fits(rank, world, folder, paths, index):
    # Lightning runs in processes started outside it (as under torchrun): it finds the
    # process group initialised and uses it.
    os.environ.update(LOCAL_RANK=str(rank), RANK=str(rank), WORLD_SIZE=str(world), NODE_RANK="0")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29500")
    _quiet()
    with _loader(paths, index=index, workers=0, ranks=True) as dl:
        try:
            length = len(dl)
        except TypeError:
            length = None
        plain = [[int(x) for x in b] for b in dl]
    runs = _runs(folder, paths, index=index, workers=0, ranks=True, devices=world)
    return (length, plain, *runs)


@pytest.mark.distributed
@pytest.mark.parametrize(
    "index", [False, pytest.param(True, marks=pytest.mark.slow)], ids=["no-index", "index"]
)
def test_a_plain_dataloader2_resumes_exactly_on_two_ddp_ranks(tmp_path, shards, index):
    require("lightning")
    got = run_ranks(rank_fits, 2, str(tmp_path), shards, index, timeout=240)
    epoch = []
    for length, plain, whole, head, at7, end in got:  # 10 steps an epoch on each rank
        assert length == (10 if index else None)  # exact with the index; unknown without
        assert whole[:10] == plain  # Lightning's first epoch is the loader's
        assert len(whole) == 20 and head == whole[:10]
        assert head[:7] + at7 == whole  # each rank takes its own batches back
        assert end == whole[10:]
        epoch += [x for b in whole[:10] for x in b]
    assert sorted(epoch) == list(range(SAMPLES))  # the ranks together: 80 of 80, none twice
