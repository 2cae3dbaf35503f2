"""The graph description numbers and places stages as the loader always has (issue 38 item 1).

Seeds are drawn by a random stage's number, and states written by earlier releases resume with
those seeds: the description's order of random stages, and which side of the sharding point
each sits on, must be what the walks it replaced gave, on any graph (forks, zips, concats).
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data.graph import traverse_dps
from torch.utils.data.graph_settings import get_all_graph_pipes

from _hyp import budget
from shardpipes.dataloader2.graph import describe, has_sharding, random_stages
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.datapipes.iter.base import StageIterDataPipe, traits_of


def _reference_random_stages(datapipe: Any) -> list[tuple[Any, bool]]:
    # The walk the description replaced (dataloader2/graph/__init__.py before issue 38).
    def below(graph: Any) -> bool:
        return any(traits_of(dp).sharding or below(src) for dp, src in graph.values())

    def walk(graph: Any) -> Any:
        for dp, sources in graph.values():
            yield dp, below(sources)
            yield from walk(sources)

    seen: set[int] = set()
    out = []
    for dp, after in walk(traverse_dps(datapipe)):
        if id(dp) in seen or not callable(getattr(dp, "set_seed", None)):
            continue
        seen.add(id(dp))
        out.append((dp, after))
    out.reverse()
    return out


def _double(x: Any) -> Any:
    return x


OPS = ["shuffle", "map", "sharding_filter", "fork_zip", "concat", "batch", "header"]


@st.composite
def graphs(draw: Any) -> Any:
    dp = IterableWrapper(range(draw(st.integers(1, 9))))
    for op in draw(st.lists(st.sampled_from(OPS), max_size=7)):
        if op == "shuffle":
            dp = dp.shuffle(buffer_size=draw(st.integers(1, 4)))
        elif op == "map":
            dp = dp.map(_double)
        elif op == "sharding_filter":
            dp = dp.sharding_filter()
        elif op == "fork_zip":
            a, b = dp.fork(2)
            dp = a.shuffle().zip(b)
        elif op == "concat":
            dp = dp.concat(IterableWrapper(range(3)).shuffle())
        elif op == "batch":
            dp = dp.batch(2)
        else:
            dp = dp.header(5)
    return dp


@settings(max_examples=budget(40), deadline=None)
@given(graphs())
def test_random_stages_are_numbered_and_placed_as_before(dp):
    expected = _reference_random_stages(dp)
    got = random_stages(dp)
    assert [(id(s), after) for s, after in got] == [(id(s), after) for s, after in expected]
    graph = describe(dp)
    assert [id(s) for s in graph.stages] == [id(s) for s in get_all_graph_pipes(traverse_dps(dp))]
    assert graph.has_sharding is has_sharding(traverse_dps(dp))
    assert graph.root is dp and graph.nodes[graph.chain[0]].stage is dp


def test_the_description_follows_the_main_path_down_to_a_stage_without_a_source():
    dp = IterableWrapper(range(4)).shuffle().sharding_filter().map(_double).batch(2)
    graph = describe(dp)
    names = [n.name for n in graph.path()]
    assert names[0] == type(dp).__name__ and names[-1] == "IterableWrapperIterDataPipe"
    assert [n.traits.batches for n in graph.path()] == [True, False, False, False, False]
    assert [n.after_sharding for n in graph.path()] == [True, True, False, False, False]
    shuffle = list(graph.path())[3]
    assert graph.node(shuffle.stage) is shuffle
    assert shuffle.traits.seeks == "buffer" and shuffle.traits.random
    assert random_stages(graph) == [(shuffle.stage, False)]


class _Rewinds(StageIterDataPipe[Any]):
    seeks = "rewind"  # not a protocol the loader knows


def test_an_unknown_seek_protocol_is_refused_naming_the_known_ones():
    with pytest.raises(ValueError, match=r"seeks='rewind'.*\('reads', 'buffer', 'count'\)"):
        describe(_Rewinds())
