"""torchdata.nodes interop: a graph as a node (as_node) and nodes inside a graph (through_nodes)."""

from __future__ import annotations

import collections
import functools

import pytest
from torchdata.nodes import Loader, ParallelMapper

from _dist import run_ranks
from _graphs import id_graph
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.nodes import World, as_node
from shardpipes.plan.restore import Topology
from shardpipes.synthetic import write_synthetic

TOTAL = 11 + 13 + 17 + 19 + 23 + 29 + 31


def epochs(loader, n=2):
    return [[list(b) for b in loader] for _ in range(n)]


def test_loader_over_a_graph_covers_everything_deterministically(shard_pattern):
    a = epochs(Loader(as_node(id_graph(shard_pattern), seed=4)))
    b = epochs(Loader(as_node(id_graph(shard_pattern), seed=4)))
    assert a == b
    assert a[0] != a[1]
    for e in a:
        assert sorted(x for batch in e for x in batch) == list(range(TOTAL))


def test_node_seeds_match_dataloader2(shard_pattern):
    via_nodes = epochs(Loader(as_node(id_graph(shard_pattern), seed=9)))
    with DataLoader2(id_graph(shard_pattern)) as dl:
        dl.seed(9)
        via_dl2 = [[list(b) for b in dl] for _ in range(2)]
    assert via_nodes == via_dl2


@pytest.mark.parametrize("k", [0, 5, 12])
def test_loader_checkpoint_resumes_exactly(shard_pattern, k):
    loader = Loader(as_node(id_graph(shard_pattern), seed=2))
    full, state = [], None
    for i, b in enumerate(loader):
        if i == k:
            state = loader.state_dict()
        full.append(list(b))
    fresh = Loader(as_node(id_graph(shard_pattern), seed=2))
    fresh.load_state_dict(state)
    assert [list(b) for b in fresh] == full[k + 1 :]  # the state was taken after batch k


def test_state_of_another_seed_is_refused(shard_pattern):
    loader = Loader(as_node(id_graph(shard_pattern), seed=2))
    next(iter(loader))
    state = loader.state_dict()
    other = Loader(as_node(id_graph(shard_pattern), seed=3))
    other.load_state_dict(state)
    with pytest.raises(ValueError, match="seed 2, this node has seed 3"):
        next(iter(other))


def test_workers_of_a_rank_split_the_shards(shard_pattern):
    parts = [
        [x for b in Loader(as_node(id_graph(shard_pattern), worker=w, num_workers=2)) for x in b]
        for w in range(2)
    ]
    assert not set(parts[0]) & set(parts[1])
    assert sorted(parts[0] + parts[1]) == list(range(TOTAL))


def test_world_is_a_reader_of_the_loaders_one_topology_and_validates():
    node = as_node(IterableWrapper(range(4)), worker=1, num_workers=2)
    assert node.world == World(worker=1, num_workers=2)
    assert node.world.topology.same_split(MultiProcessingReadingService(2).topology())
    assert node.world.topology == Topology(readers_per_rank=2)
    with pytest.raises(ValueError, match=r"rank\(3\) should be in \[0, world_size\(2\)\)"):
        as_node(IterableWrapper(range(4)), rank=3, world_size=2)
    with pytest.raises(
        ValueError, match=r"worker\(2\) should be in \[0, max\(num_workers\(2\), 1\)\)"
    ):
        World(worker=2, num_workers=2)


def test_parallel_mapper_inside_a_graph_keeps_order():
    build = functools.partial(ParallelMapper, map_fn=abs, num_workers=3, method="thread")
    data = list(range(-50, 50))
    assert list(IterableWrapper(data).through_nodes(build)) == [abs(x) for x in data]


def rank_via_nodes(rank, world, pattern):
    return epochs(Loader(as_node(id_graph(pattern), seed=1)))


def rank_via_nodes_twice(rank, world, pattern):
    return [rank_via_nodes(rank, world, pattern) for _ in range(2)]


@pytest.mark.distributed
def test_nodes_path_on_three_ranks(tmp_path):
    counts = [11, 13, 17, 19, 23, 29, 31]
    write_synthetic(tmp_path, shards=7, samples=counts, payload_bytes=16)
    pattern = f"{tmp_path}/train-{{000000..000006}}.tar"
    # Twice on the same 3 ranks (one job; two before): the same seed gives the same epochs.
    first, again = zip(*run_ranks(rank_via_nodes_twice, 3, pattern), strict=True)
    assert first == again
    for e in range(2):
        per_rank = [r[e] for r in first]
        assert len({len(b) for b in per_rank}) == 1, [len(b) for b in per_rank]
        seen = collections.Counter(x for batches in per_rank for b in batches for x in b)
        assert all(c == 1 for c in seen.values()), "a sample appeared twice"
        assert set(seen) <= set(range(sum(counts)))
