"""Reading services declare themselves; a service written outside the package gets every guarantee.

``_thread_service.ThreadReadingService`` implements only the public protocol
(docs/reading-services.md): readers in threads, ranks from ``torch.distributed``.
"""

from __future__ import annotations

import pathlib
import re
from collections import Counter

import pytest

from _dist import run_ranks
from _graphs import indexed_graph, resumed, uninterrupted
from _thread_service import ThreadReadingService
from shardpipes.dataloader2 import (
    DataLoader2,
    DistributedReadingService,
    InProcessReadingService,
    MultiProcessingReadingService,
    SequentialReadingService,
)
from shardpipes.dataloader2.protocol import ReadingService, Topology
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import AttestationError
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic

COUNTS = [37, 20, 51, 8, 44]  # 160 samples, 40 batches of 4
LOADER = pathlib.Path(__file__).parents[1] / "pipes" / "shardpipes" / "dataloader2"


@pytest.fixture(scope="module")
def indexed(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("protocol")
    paths = write_synthetic(folder, shards=len(COUNTS), samples=COUNTS, payload_bytes=16)
    build_index(paths, progress=False).save(default_index_url(paths))
    return f"{folder}/train-{{000000..{len(COUNTS) - 1:06d}}}.tar"


def mp(workers: int) -> MultiProcessingReadingService:
    return MultiProcessingReadingService(num_workers=workers, multiprocessing_context="fork")


def ids(batches) -> Counter:
    return Counter(x for b in batches for x in b)


def test_the_loader_asks_no_service_its_class():
    found = [
        f"{path.name}:{n}"
        for path in sorted(LOADER.rglob("*.py"))
        if path.name != "reading_service.py"
        for n, line in enumerate(path.read_text().splitlines(), 1)
        # a test of a service's class, or a read of another object's private group
        if re.search(r"isinstance\([^)]*ReadingService|(?<!self)\._group\b", line)
    ]
    assert found == []


def test_built_in_services_declare_their_topology():
    assert InProcessReadingService().topology() == Topology(1, 0, False)
    assert mp(3).topology() == Topology(1, 3, False)
    seq = SequentialReadingService(DistributedReadingService(), mp(2))
    assert seq.topology() == Topology(1, 2, True)  # no process group: one rank, split by rank
    assert [type(p) for p in seq.parts()] == [
        DistributedReadingService,
        MultiProcessingReadingService,
    ]
    assert seq.share_seed(5) == 5 and seq.collectives() is None
    assert all(isinstance(s, ReadingService) for s in (seq, mp(0), ThreadReadingService()))
    assert Topology(2, 3).readers == 6 and Topology(2, 0).readers == 2
    with pytest.raises(ValueError, match="numbering 'column-major' is not known"):
        Topology(numbering="column-major")


def test_a_thread_service_yields_what_the_worker_pool_yields_and_resumes(indexed):
    threads, states = uninterrupted(indexed_graph(indexed), ThreadReadingService(2), epochs=2)
    pool, pool_states = uninterrupted(indexed_graph(indexed), mp(2), epochs=2)
    assert threads == pool and len(threads) == 80  # the same seeds, the same split, the same order
    assert states[7]["num_workers"] == 2 and states[7]["consumed"] == 7
    # Exact resume, on itself and across services (a state is not the service's).
    assert resumed(indexed_graph(indexed), ThreadReadingService(2), states[7], 73) == threads[7:]
    assert resumed(indexed_graph(indexed), mp(2), states[7], 73) == threads[7:]
    assert (
        resumed(indexed_graph(indexed), ThreadReadingService(2), pool_states[30], 50) == pool[30:]
    )
    # Elastic: 2 readers -> 3, and a second resume 3 -> 1; each sample of the epoch once.
    with DataLoader2(indexed_graph(indexed), reading_service=ThreadReadingService(3)) as dl:
        dl.load_state_dict(states[7])
        it = iter(dl)
        middle = [list(next(it)) for _ in range(5)]
        second = dl.state_dict()
    assert second["segments"] == [[1, 2, 0, 7]] and second["consumed"] == 5
    with DataLoader2(indexed_graph(indexed), reading_service=mp(0)) as dl:
        dl.load_state_dict(second)
        rest = [list(b) for b in dl]
    assert ids(threads[:7] + middle + rest) == ids(threads[:40])


def _ranks_first(rank, world, pattern, k):
    """2 ranks x 2 threads, attested every 2 batches: the epoch, and a state after k batches."""
    with DataLoader2(indexed_graph(pattern), reading_service=ThreadReadingService(2)) as dl:
        dl.attest(every=2)
        dl.seed(3)
        full = [list(b) for b in dl]
    with DataLoader2(indexed_graph(pattern), reading_service=ThreadReadingService(2)) as dl:
        dl.seed(3)
        it = iter(dl)
        part = [list(next(it)) for _ in range(k)]
        state = dl.state_dict()
    # Each rank reading everything: the ranks' check finds it on the collectives it was given.
    unsharded = (
        IterableWrapper([pattern]).shard_expand().open_files_by_fsspec().load_from_tar()
        .webdataset().batch(4)
    )  # fmt: skip
    with DataLoader2(unsharded, reading_service=ThreadReadingService(1)) as dl:
        dl.attest(every=2)
        dl.seed(1)
        try:
            list(dl)
            caught = None
        except AttestationError as exc:
            caught = exc.fault
    return full, part, state, caught


def _ranks_rest(rank, world, pattern, state):
    with DataLoader2(indexed_graph(pattern), reading_service=ThreadReadingService(1)) as dl:
        dl.attest(every=2)
        dl.load_state_dict(state)
        return [list(b) for b in dl]


@pytest.mark.distributed
def test_a_thread_service_on_gloo_ranks_equal_batches_elastic_resume_attestation(indexed):
    k = 6
    first = run_ranks(_ranks_first, 2, indexed, k)
    assert len({len(full) for full, _, _, _ in first}) == 1  # equal batches on every rank
    for full, part, _, caught in first:
        assert part == full[:k]
        assert caught == "duplicate"
    assert not set(ids(first[0][0])) & set(ids(first[1][0]))  # the ranks split the data
    epoch = ids([b for full, _, _, _ in first for b in full])
    assert sum(epoch.values()) == 160 and max(epoch.values()) == 1
    state = first[0][2]
    assert (state["world_size"], state["num_workers"], state["distributed"]) == (2, 2, True)
    rest = run_ranks(_ranks_rest, 3, indexed, state)  # 2 x 2 -> 3 x 1
    assert len({len(r) for r in rest}) == 1
    before = ids([b for _, part, _, _ in first for b in part])
    assert before + ids([b for r in rest for b in r]) == epoch
