"""dataloader2.linter: 0.9's shuffle-before-sharding check, on single and forked paths."""

import pytest

from shardpipes.dataloader2.linter import _check_shuffle_before_sharding
from shardpipes.datapipes.iter import IterableWrapper


def _double(x):
    return 2 * x


@pytest.mark.parametrize(
    ("build", "expected"),
    [
        (lambda src: src.map(_double), True),  # nothing sharded
        (lambda src: src.shuffle().sharding_filter(), True),
        (lambda src: src.sharding_filter(), False),
        (lambda src: src.sharding_filter().shuffle(), False),  # shuffled only after the split
    ],
    ids=["unsharded", "shuffled", "unshuffled", "shuffle-after"],
)
def test_single_path(build, expected):
    assert _check_shuffle_before_sharding(build(IterableWrapper(range(10)))) is expected


def test_every_branch_below_the_split_needs_a_shuffle():
    a, b = IterableWrapper([(i, i) for i in range(10)]).unzip(2)
    one_shuffled = a.shuffle().zip(b).sharding_filter()
    assert _check_shuffle_before_sharding(one_shuffled) is False
    both_shuffled = a.shuffle().zip(b.shuffle()).sharding_filter()
    assert _check_shuffle_before_sharding(both_shuffled) is True
