"""header, set_length, cycle and fixed_length: bounding and fixing the number of items."""

from __future__ import annotations

import pickle

import pytest

from _tars import ABC, keys, write_tar
from shardpipes.datapipes.iter import Cycler, FixedLength, Header, IterableWrapper, LengthSetter


class Counting:
    """An iterable that counts how many items were drawn from it and how often it was started."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.drawn = 0
        self.starts = 0

    def __iter__(self):
        self.starts += 1
        for i in range(self.n):
            self.drawn += 1
            yield i


def no_len(n: int):
    """A DataPipe of ``range(n)`` with no length."""
    return IterableWrapper(range(n)).filter(_true)


def _true(_: object) -> bool:
    return True


# --- header --------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n", "limit", "expected"), [(10, 3, 3), (2, 5, 2), (4, 0, 0), (0, 3, 0)])
def test_header_yields_at_most_limit(n, limit, expected):
    dp = IterableWrapper(range(n)).header(limit)
    assert list(dp) == list(range(expected))
    assert len(dp) == expected


def test_header_draws_no_more_than_it_yields():
    src = Counting(100)
    assert list(Header(src, 3)) == [0, 1, 2]
    assert src.drawn == 3
    assert list(Header(src, 0)) == [] and src.starts == 1


def test_header_len_without_source_len_is_the_limit_with_a_warning():
    # torchdata 0.9: the limit stands in for the unknown length, with a warning.
    with pytest.warns(UserWarning, match="inferred to be equal to its limit"):
        assert len(no_len(5).header(2)) == 2
    with pytest.raises(TypeError, match="cannot be determined"):
        len(no_len(5).header(None))


def test_header_none_passes_the_source_through():
    dp = IterableWrapper(range(4)).header(None)
    assert list(dp) == [0, 1, 2, 3]
    assert len(dp) == 4


@pytest.mark.parametrize("bad", [-1, 1.5, True], ids=["negative", "float", "bool"])
def test_header_bad_limit(bad):
    with pytest.raises(ValueError, match=rf"limit should be a non-negative integer, got {bad!r}"):
        IterableWrapper([]).header(bad)


# --- set_length ----------------------------------------------------------------------------------


def test_set_length_gives_a_length_and_leaves_the_items():
    # torchdata 0.9: set_length only sets len(); header(n) caps the items.
    dp = no_len(10).set_length(4)
    assert len(dp) == 4
    assert list(dp) == list(range(10))


def test_set_length_longer_than_the_source_reports_what_was_set():
    dp = LengthSetter(IterableWrapper(range(2)), 5)
    assert len(dp) == 5
    assert list(dp) == [0, 1]


def test_set_length_bad_value():
    with pytest.raises(ValueError, match=r"length should be a non-negative integer, got -2"):
        IterableWrapper([]).set_length(-2)
    with pytest.raises(AssertionError):  # what 0.9 raised
        IterableWrapper([]).set_length(-2)


# --- cycle ---------------------------------------------------------------------------------------


def test_cycle_count():
    dp = IterableWrapper([1, 2]).cycle(3)
    assert list(dp) == [1, 2, 1, 2, 1, 2]
    assert len(dp) == 6


def test_cycle_zero_and_empty():
    assert list(IterableWrapper([1, 2]).cycle(0)) == []
    assert list(IterableWrapper([]).cycle(4)) == []
    assert len(IterableWrapper([]).cycle(4)) == 0


def test_cycle_forever_has_no_length_and_keeps_going():
    dp = IterableWrapper([1, 2, 3]).cycle()
    assert list(dp.header(8)) == [1, 2, 3, 1, 2, 3, 1, 2]
    with pytest.raises(TypeError, match="CyclerIterDataPipe instance cycles forever"):
        len(dp)


def test_cycle_forever_over_an_empty_source_is_an_error():
    with pytest.raises(ValueError, match=r"cycle\(\) over an empty source .* would never end"):
        list(Cycler(IterableWrapper([])).header(1))


def test_cycle_restarts_the_source_each_pass(tmp_path):
    url = write_tar(tmp_path / "s.tar", ABC)
    dp = IterableWrapper([url]).open_files_by_fsspec().load_from_tar().webdataset().cycle(2)
    assert keys(dp) == ["a", "b", "c"] * 2


# --- fixed_length --------------------------------------------------------------------------------


def test_fixed_length_restarts_a_short_source():
    dp = IterableWrapper(range(3)).fixed_length(7)
    assert list(dp) == [0, 1, 2, 0, 1, 2, 0]
    assert len(dp) == 7


def test_fixed_length_continues_a_long_source_next_epoch():
    dp = IterableWrapper(range(5)).fixed_length(3)
    epochs = [list(dp) for _ in range(4)]
    assert epochs == [[0, 1, 2], [3, 4, 0], [1, 2, 3], [4, 0, 1]]
    assert all(len(e) == len(dp) == 3 for e in epochs)


def test_fixed_length_exactly_n_per_epoch_over_many_epochs():
    src = Counting(7)
    dp = FixedLength(src, 5)
    seen = [x for _ in range(7) for x in dp]
    assert len(seen) == 35
    assert sorted(seen) == sorted(list(range(7)) * 5)  # 5 full passes: every item equally often
    assert src.starts == 5


def test_fixed_length_early_break_continues_from_there():
    dp = IterableWrapper(range(10)).fixed_length(4)
    for x in dp:
        if x == 1:
            break
    assert list(dp) == [2, 3, 4, 5]


def test_fixed_length_over_a_shard_pipeline(tmp_path):
    url = write_tar(tmp_path / "s.tar", ABC)
    dp = IterableWrapper([url]).open_files_by_fsspec().load_from_tar().webdataset().fixed_length(2)
    assert [keys(dp) for _ in range(3)] == [["a", "b"], ["c", "a"], ["b", "c"]]


def test_fixed_length_over_an_empty_source_is_an_error():
    dp = IterableWrapper([]).fixed_length(3)
    with pytest.raises(ValueError, match=r"fixed_length\(3\) over a source that yields nothing"):
        list(dp)


def test_fixed_length_zero_over_an_empty_source_is_empty():
    assert list(IterableWrapper([]).fixed_length(0)) == []


def test_fixed_length_copy_starts_from_the_beginning():
    dp = IterableWrapper(range(5)).fixed_length(3)
    assert list(dp) == [0, 1, 2]
    copy = pickle.loads(pickle.dumps(dp))
    assert list(copy) == [0, 1, 2]
    assert list(dp) == [3, 4, 0]


def test_fixed_length_bad_value():
    with pytest.raises(ValueError, match=r"length should be a non-negative integer, got -1"):
        IterableWrapper([]).fixed_length(-1)
