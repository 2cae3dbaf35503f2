"""DataLoader2 with torchdata 0.9's arguments and semantics (issue 16)."""

import pickle
import random

import numpy as np
import pytest
import torch

from shardpipes.dataloader2 import (
    DataLoader2,
    DataLoader2Iterator,
    InProcessReadingService,
    MultiProcessingReadingService,
    PrototypeMultiProcessingReadingService,
    ReadingServiceInterface,
)
from shardpipes.dataloader2.adapter import CacheTimeout, Shuffle
from shardpipes.dataloader2.graph import (
    find_dps,
    list_dps,
    remove_dp,
    replace_dp,
    set_graph_random_seed,
    traverse_dps,
)
from shardpipes.dataloader2.random import SeedGenerator
from shardpipes.dataloader2.utils import WorkerInfo
from shardpipes.datapipes.iter import IterableWrapper, Mapper, Shuffler


def _draws(x):
    return x, random.random(), float(np.random.rand()), float(torch.rand(()))


def _times_ten(x):
    return x * 10


def _init(datapipe, info):
    assert isinstance(info, WorkerInfo) and info == info.worker_id and info.num_workers == 2
    return datapipe.map(_times_ten)


def _reset_same_seed(datapipe, info, seed_generator):
    seed_generator.seed(123)
    set_graph_random_seed(datapipe, seed_generator)
    return datapipe


def test_torch_manual_seed_decides_the_order_without_seed():
    dp = IterableWrapper(range(50)).shuffle()
    with DataLoader2(dp) as dl:
        torch.manual_seed(1)
        first, second = list(dl), list(dl)
        torch.manual_seed(1)
        assert list(dl) == first
        assert first != second and sorted(first) == list(range(50))
        torch.manual_seed(2)
        assert list(dl) != first


@pytest.mark.parametrize("seed", [-1, 2**70, 0], ids=["negative", "huge", "zero"])
def test_any_integer_seed(seed):
    dp = IterableWrapper(range(20)).shuffle()
    with DataLoader2(dp) as dl:
        dl.seed(seed)
        first = list(dl)
        dl.seed(seed)
        assert list(dl) == first and sorted(first) == list(range(20))


def test_seed_seeds_random_numpy_and_torch_in_each_worker():
    dp = IterableWrapper(range(8)).sharding_filter().map(_draws)
    rs = MultiProcessingReadingService(num_workers=2, worker_prefetch_cnt=0)
    with DataLoader2(dp, reading_service=rs) as dl:
        dl.seed(5)
        first = list(dl)
        dl.seed(5)
        again = list(dl)
        dl.seed(6)
        other = list(dl)
    assert first == again
    assert [x[1:] for x in first] != [x[1:] for x in other]
    assert len({x[1] for x in first}) == 8  # workers draw different numbers


def test_worker_init_and_reset_fns():
    dp = IterableWrapper(range(20)).sharding_filter().shuffle()
    rs = PrototypeMultiProcessingReadingService(
        num_workers=2, worker_init_fn=_init, worker_reset_fn=_reset_same_seed
    )
    with DataLoader2(dp, reading_service=rs) as dl:
        first, second = list(dl), list(dl)
    assert sorted(first) == [x * 10 for x in range(20)]
    assert first == second  # the reset fn seeds every epoch alike


def test_adapters_turn_shuffles_on_and_off():
    size = 40
    with DataLoader2(IterableWrapper(range(size)).shuffle(), [Shuffle(False)]) as dl:
        assert list(dl) == list(range(size))
    with pytest.warns(UserWarning, match="does not contain a `Shuffler`"):
        dl = DataLoader2(IterableWrapper(range(size)), datapipe_adapter_fn=Shuffle(True))
    with dl:
        out = list(dl)
    assert out != list(range(size)) and sorted(out) == list(range(size))
    with pytest.raises(ValueError, match="timeout should be integer"):
        CacheTimeout()


def test_a_new_iterator_invalidates_the_old_one():
    with DataLoader2(IterableWrapper(range(5))) as dl:
        it1 = iter(dl)
        assert isinstance(it1, DataLoader2Iterator) and next(it1) == 0
        it2 = iter(dl)
        assert next(it2) == 0
        with pytest.raises(RuntimeError, match="invalidated"):
            next(it1)
        assert list(it2) == [1, 2, 3, 4]


class _Wrapper:
    def __init__(self, dp):
        self.dp = dp

    def __iter__(self):
        self.it = iter(self.dp)
        return self

    def __next__(self):
        return next(self.it)

    def hello(self):
        return "hi"


class _OldStyleService(ReadingServiceInterface):
    """A 0.9 service: returns no seed generator, and a reset function from initialize_iteration."""

    def initialize(self, datapipe):
        self.seen = []
        return datapipe

    def initialize_iteration(self, seed_generator, iter_reset_fn=None):
        self.seen.append(seed_generator.generate_shared_seed())
        return _Wrapper


def test_a_09_reading_service_gets_a_seed_generator_and_its_reset_fn_is_applied():
    rs = _OldStyleService()
    with DataLoader2(IterableWrapper(range(3)), reading_service=rs) as dl:
        dl.seed(1)
        it = iter(dl)
        assert it.hello() == "hi"  # attributes of the graph's iterator
        assert list(it) == [0, 1, 2]
    assert len(rs.seen) == 1 and isinstance(rs.seen[0], int)


class _Recording(MultiProcessingReadingService):
    """Ours, subclassed without overriding initialize_iteration: still handed the plan."""

    def __init__(self):
        super().__init__(num_workers=0)


class _Overriding(InProcessReadingService):
    """0.9 code overriding initialize_iteration: handed the facade, passes it to ours."""

    def __init__(self):
        super().__init__()
        self.given = []

    def initialize_iteration(self, seed_generator, iter_reset_fn=None):
        self.given.append(seed_generator)
        return super().initialize_iteration(seed_generator, iter_reset_fn)


def test_our_services_take_the_epoch_plan_and_a_09_service_the_seed_generator_facade():
    from shardpipes.dataloader2 import EpochPlan, SequentialReadingService
    from shardpipes.dataloader2.reading_service import handed

    old, overriding = _OldStyleService(), _Overriding()
    plan = EpochPlan(5, 1)
    assert handed(InProcessReadingService(), plan) is plan
    assert handed(_Recording(), plan) is plan
    assert handed(SequentialReadingService(InProcessReadingService()), plan) is plan
    for foreign in (old, overriding):
        facade = handed(foreign, plan)
        assert isinstance(facade, SeedGenerator) and facade._plan == plan
    # in a loader: the 0.9 service draws from the facade; the same seed gives the same draws
    dp = IterableWrapper(range(4)).shuffle()
    runs = []
    for _ in range(2):
        rs = SequentialReadingService(_OldStyleService(), _Overriding())
        with DataLoader2(dp, reading_service=rs) as dl:
            dl.seed(9)
            runs.append(list(dl))
        assert isinstance(rs.reading_services[1].given[0], SeedGenerator)
        assert rs.reading_services[1].given[0]._plan == EpochPlan(9, 0)
    assert runs[0] == runs[1] and sorted(runs[0]) == [0, 1, 2, 3]


def test_state_with_the_graph_restores_a_loader_made_without_one():
    dp = IterableWrapper(range(6)).shuffle()
    with DataLoader2(dp, reading_service=InProcessReadingService()) as dl:
        dl.seed(3)
        it = iter(dl)
        head = [next(it), next(it)]
        state = dl.state_dict(graph=True)
        rest = list(it)
    assert pickle.loads(state["serialized_datapipe"]) is not None
    assert state["reading_service_state"] is None
    with DataLoader2(None) as restored:
        restored.load_state_dict(state_dict=state)
        assert restored.state_dict(graph=True) == state
        assert list(restored) == rest
    assert sorted(head + rest) == list(range(6))
    with DataLoader2.from_state(state, InProcessReadingService()) as restored:
        assert list(restored) == rest
    plain = dict(state, serialized_datapipe=None)
    with pytest.raises(ValueError, match="state_dict\\(graph=True\\)"):
        DataLoader2(None).load_state_dict(plain)


def test_seed_generator_api():
    sg = SeedGenerator(123)
    first = [sg.generate_seed() for _ in range(3)]
    sg.seed(123)
    assert [sg.generate_seed() for _ in range(3)] == first
    a, b = sg.spawn(1), sg.spawn(2)
    assert a.generate_shared_seed() == b.generate_shared_seed()
    assert a.generate_seed() != b.generate_seed()
    assert sg.spawn(1).generate_seed() == sg.spawn(1).generate_seed()
    assert sg.spawn(3, inplace=True) is sg
    with pytest.raises(ValueError, match="rank"):
        sg.spawn(-1)
    with pytest.raises(ValueError, match="uint64"):
        sg.seed(2**64)


def test_graph_functions():
    source = IterableWrapper(range(4))
    shuffled = source.shuffle()
    end = shuffled.map(_times_ten)
    graph = traverse_dps(end)
    assert find_dps(graph, Shuffler) == [shuffled]
    assert list_dps(graph) == [end, shuffled, source]
    assert list_dps(graph, exclude_dps=shuffled) == [end]
    graph = remove_dp(graph, shuffled)
    assert list(end) == [0, 10, 20, 30]
    graph = replace_dp(graph, end, Mapper(source, _times_ten).map(_times_ten))
    (new_end,) = [dp for dp, _ in graph.values()]
    assert list(new_end) == [0, 100, 200, 300]
    with pytest.raises(RuntimeError, match="source DataPipe"):
        remove_dp(graph, source)


@pytest.mark.parametrize("workers", [0, 2], ids=["in-process", "2-workers"])
def test_limit_pauses_and_resume_continues_the_epoch(workers):
    dp = IterableWrapper(range(10)).sharding_filter()
    rs = MultiProcessingReadingService(num_workers=workers, worker_prefetch_cnt=0)
    with DataLoader2(dp, reading_service=rs) as dl:
        it = iter(dl)
        it.limit(3)
        first = list(it)
        with pytest.raises(StopIteration):
            next(it)
        it.resume()
        second = list(it)
        it.limit(None)
        it.resume()
        rest = list(it)
    assert (len(first), len(second)) == (3, 3)
    assert sorted(first + second + rest) == list(range(10))


def test_in_process_service_takes_09_arguments():
    rs = InProcessReadingService(2, init_fn=lambda dp, info: dp.map(_times_ten))
    with DataLoader2(IterableWrapper(range(4)), reading_service=rs) as dl:
        assert list(dl) == [0, 10, 20, 30]
