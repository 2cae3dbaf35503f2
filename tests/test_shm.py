"""Large payloads cross from workers through reused shared memory, and arrive unchanged."""

from __future__ import annotations

import os
import pickle
import signal

import numpy as np
import pytest
import torch
from torch.utils.data.datapipes.datapipe import DataChunk

from _shm_blocks import PREFIX_ENV, blocks_left, named_blocks, new_prefix
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2.workers.attachments import Attachments
from shardpipes.dataloader2.workers.messages import AsIs, Inline, Pickled, Skeleton, Values
from shardpipes.dataloader2.workers.ring import Ring
from shardpipes.dataloader2.workers.values import MIN_BYTES
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.formats.stream import StreamBytes
from shardpipes.synthetic import write_synthetic


@pytest.fixture(autouse=True)
def _own_prefix(monkeypatch):
    # Each test's blocks have their own names: other runs on the machine, and this module's
    # earlier tests (whose last blocks go with their last values), never count as leftovers.
    monkeypatch.setenv(PREFIX_ENV, new_prefix())


def _prefix() -> str:
    return os.environ[PREFIX_ENV]


def leftover_blocks(owner: str = "") -> list[str]:
    """Traces of this test's blocks: a name in /dev/shm, a map or a descriptor in any process."""
    return blocks_left(_prefix())


def pack(ring, batch):
    """``batch`` in a block, alone (a worker's bundle of one item)."""
    return ring.pack([batch])


def unpack(attached, bundled):
    (item,) = attached.unpack(bundled)
    return item


def kind(bundled):
    (entry,) = bundled.entries
    return type(entry)


def spans(bundled):
    """Where the large values of a bundle of one item are in its block."""
    (entry,) = bundled.entries
    assert type(entry) in (Skeleton, Values)
    return entry.spans


def skeleton(bundled, attached):
    """The rest of the item: pickled into the block, or with the message if it holds tensors."""
    (entry,) = bundled.entries
    if type(entry) is Values:
        return entry.skeleton
    assert type(entry) is Skeleton
    block = attached.reader(bundled).buf
    return pickle.loads(block[entry.at : entry.at + entry.nbytes])


def sent_as_is(bundled, batch):
    """Nothing in a block: ``batch`` itself goes with the message (torch's queue)."""
    return (
        bundled.name is None
        and bundled.entries == [AsIs(batch)]
        and (bundled.entries[0].item is batch)
    )


def test_pack_and_unpack_give_back_the_same_batch():
    big, small = os.urandom(MIN_BYTES), b"x" * 10
    batch = DataChunk([{"__key__": "a", ".bin": big, ".txt": small}, {".bin": big + b"!"}])
    attached = Attachments()
    ring = Ring(attached.make(1, 3)[0], attached.owner)
    try:
        packed = pack(ring, batch)
        assert len(spans(packed)) == 2
        assert kind(packed) == Skeleton  # the rest of the batch is in the block too
        rest = skeleton(packed, attached)
        assert all(len(v) < 100 for v in rest[0].values() if isinstance(v, bytes))
        back = unpack(attached, packed)
        assert back == batch and type(back) is DataChunk
        assert type(back[0][".bin"]) is bytes
        plain = [{"a": small}, (1, 2)]
        pickled = pack(ring, plain)  # nothing large: the whole batch pickled into a block
        assert kind(pickled) == Pickled and unpack(attached, pickled) == plain
        assert sent_as_is(pack(ring, (1, 2)), (1, 2))  # not a batch (a list): sent as it is
        for i in range(5):  # the ring wraps around and keeps serving exact copies
            item = (os.urandom(MIN_BYTES + i), i)
            assert unpack(attached, pack(ring, item)) == item
    finally:
        ring.close()
        attached.close()
    assert not leftover_blocks(attached.owner)


def test_a_batch_larger_than_its_block_gets_a_larger_block():
    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        first = [b"a" * MIN_BYTES]
        unpack(attached, pack(ring, first))  # sizes the block of ring slot 1 (8 MiB)
        unpack(attached, pack(ring, first))  # slot 0
        old = attached.blocks[ring.handles[1].index]
        huge = [os.urandom(9 << 20)]
        packed = pack(ring, huge)
        assert kind(packed) == Skeleton and ring.blocks[1].size > 9 << 20
        assert unpack(attached, packed) == huge
        # the same block, made larger: mapped again here, the old map let go of
        assert attached.blocks[ring.handles[1].index].size > 9 << 20 and old.buf is None
        assert len(attached.blocks) == 2 and not named_blocks(_prefix())
    finally:
        ring.close()
        attached.close()
    assert not leftover_blocks(attached.owner)


def test_a_block_not_yet_copied_out_is_not_written_again():
    """More batches in flight than blocks (all requests going to one worker at the end of an
    epoch): the batch that finds its block still in use goes with the message instead."""
    attached = Attachments()
    ring = Ring(attached.make(1, 1)[0], attached.owner)
    try:
        first = [os.urandom(MIN_BYTES)]
        packed = pack(ring, first)
        second = [os.urandom(MIN_BYTES)]
        instead = pack(ring, second)  # the only block still holds `first`
        assert instead.name is None and instead.entries == [AsIs(second)]
        small = pack(ring, [1, 2])  # a batch for the block, none free: pickled with the message
        assert small.name is None and kind(small) == Inline and unpack(attached, small) == [1, 2]
        assert unpack(attached, packed) == first  # intact
        assert kind(pack(ring, second)) == Skeleton  # copied out: the block is free again
    finally:
        ring.close()
        attached.close()


def test_an_overwritten_block_is_detected():
    import struct

    attached = Attachments()
    ring = Ring(attached.make(1, 1)[0], attached.owner)
    try:
        packed = pack(ring, [os.urandom(MIN_BYTES)])
        block = ring.blocks[0]
        struct.pack_into("<q", block.buf, 0, packed.seq + 1)  # as if written again too early
        with pytest.raises(RuntimeError, match="overwritten"):
            unpack(attached, packed)
    finally:
        ring.close()
        attached.close()


def payload(sample):
    return sample[".json"]["id"], sample[".bin"]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_deliver_large_payloads_exactly_and_leave_no_blocks(tmp_path, context):
    paths = write_synthetic(tmp_path, shards=4, samples=[9, 5, 7, 3], payload_bytes=MIN_BYTES * 2)
    dp = (
        IterableWrapper(paths).sharding_filter().open_files_by_fsspec().load_from_tar()
        .webdataset().decode().map(payload).batch(4)
    )  # fmt: skip
    expected = sorted(x for b in DataLoader2(dp) for x in b)
    rs = MultiProcessingReadingService(num_workers=2, multiprocessing_context=context)
    with DataLoader2(dp, reading_service=rs) as dl:
        got = [sorted(x for b in dl for x in b) for _ in range(2)]
        assert rs._attached.blocks  # the payloads came through shared memory
    assert got == [expected, expected]
    assert all(isinstance(data, bytes | StreamBytes) for _, data in expected)
    # webdataset's values (StreamBytes) come out of shared memory as the same type
    assert [type(d) for _, d in got[0]] == [type(d) for _, d in expected]
    assert not leftover_blocks(rs._attached.owner)


def test_two_loaders_in_one_process_keep_their_own_blocks(tmp_path):
    paths = write_synthetic(tmp_path, shards=2, samples=[6, 6], payload_bytes=MIN_BYTES * 2)
    dp = (
        IterableWrapper(paths).sharding_filter().open_files_by_fsspec().load_from_tar()
        .webdataset().decode().map(payload).batch(2)
    )  # fmt: skip

    def rs():
        return MultiProcessingReadingService(num_workers=2, multiprocessing_context="fork")

    with DataLoader2(dp, reading_service=rs()) as train:
        first = sorted(x for b in train for x in b)
        with DataLoader2(dp, reading_service=rs()) as val:
            assert sorted(x for b in val for x in b) == first
        # val's shutdown removed only its own blocks: train's next epoch still reads its own
        assert sorted(x for b in train for x in b) == first


def test_without_shared_memory_batches_are_pickled(monkeypatch, tmp_path):
    monkeypatch.setenv("SHARDPIPES_SHM_DIR", str(tmp_path / "missing"))  # no block can be made
    ring = Ring(Attachments().make(1, 2)[0], "test")
    item = [os.urandom(MIN_BYTES)]
    first = pack(ring, item)
    assert first.name is None and first.entries == [AsIs(item)] and ring.broken
    assert sent_as_is(pack(ring, item), item)  # it does not try again for every batch


_FAULTS_PER_BATCH = """
import os, resource
from shardpipes.dataloader2.workers.attachments import Attachments
from shardpipes.dataloader2.workers.ring import Ring
attached = Attachments()
ring = Ring(attached.make(1, 3)[0], attached.owner)
batch = [{".bin": os.urandom(100_000)} for _ in range(64)]  # the large preset: 6.4 MB
try:
    for i in range(33):
        if i == 3:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        (out,) = attached.unpack(ring.pack([batch]))
        assert out == batch
        del out  # freed a batch later, as a training loop does
    print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 30)
finally:
    attached.close()
"""


def test_the_main_process_reuses_its_heap_for_batches_copied_out():
    # A fresh interpreter: glibc's thresholds start at their defaults, as in a new training
    # process. Without _keep_heap each batch faulted its 6.4 MB in again (~1,600 pages).
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _FAULTS_PER_BATCH], capture_output=True, text=True, check=True
    )
    assert float(out.stdout) < 160, f"{out.stdout.strip()} page faults per 6.4 MB batch"


# Tensors: every dtype torch has for data, shapes with and without elements.
_DTYPES = [
    torch.float16, torch.bfloat16, torch.float32, torch.float64, torch.complex64,
    torch.complex128, torch.int8, torch.int16, torch.int32, torch.int64, torch.uint8,
    torch.uint16, torch.uint32, torch.uint64, torch.bool, torch.float8_e4m3fn,
]  # fmt: skip
_SHAPES = [(), (0,), (1,), (3, 224, 224), (2, 0, 5), (7, 13)]


def random_tensor(shape, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    raw = torch.randint(
        0, 256, (int(np.prod(shape)) * dtype.itemsize,), dtype=torch.uint8, generator=g
    )
    return raw.view(dtype).reshape(shape)  # any bit pattern: NaNs, infinities, denormals


def same_tensor(a, b):
    return (
        type(a) is type(b) is torch.Tensor
        and a.dtype == b.dtype
        and a.shape == b.shape
        and a.stride() == b.stride()
        and torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))
    )


@pytest.mark.parametrize("dtype", _DTYPES, ids=str)
def test_tensors_cross_bit_for_bit(dtype):
    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        tensors = [random_tensor(shape, dtype, i) for i, shape in enumerate(_SHAPES)]
        batch = [{"__key__": f"k{i}", ".x": t, ".cls": i} for i, t in enumerate(tensors)]
        packed = pack(ring, batch)
        assert len(spans(packed)) == len(tensors)
        back = unpack(attached, packed)
        for sent, got in zip(tensors, back, strict=True):
            assert same_tensor(sent, got[".x"])
            assert not got[".x"].is_shared()  # a tensor of its own, not a view of the block
        assert [s[".cls"] for s in back] == list(range(len(tensors)))
    finally:
        ring.close()
        attached.close()


def test_a_received_tensor_does_not_change_when_the_block_is_reused():
    attached = Attachments()
    ring = Ring(attached.make(1, 1)[0], attached.owner)
    try:
        first = unpack(attached, pack(ring, [torch.ones(1000)]))[0]
        unpack(attached, pack(ring, [torch.zeros(1000)]))  # the same block, written again
        assert torch.equal(first, torch.ones(1000))
    finally:
        ring.close()
        attached.close()


def test_the_same_tensor_twice_in_a_batch_arrives_as_one_object():
    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        t = torch.arange(10.0)
        packed = pack(ring, [{"a": t, "b": t}])
        assert len(spans(packed)) == 1
        back = unpack(attached, packed)[0]
        assert back["a"] is back["b"] and torch.equal(back["a"], t)
    finally:
        ring.close()
        attached.close()


@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor:UserWarning")
def test_tensors_that_are_more_than_their_contents_are_left_to_torch():
    base = torch.arange(24.0).reshape(4, 6)
    others = {
        "view": base[1:],  # a view into a larger storage: shares memory with `base`
        "transposed": base.t(),
        "grad": torch.ones(3, requires_grad=True),
        "parameter": torch.nn.Parameter(torch.ones(3)),
        "shared": torch.ones(3).share_memory_(),
        "conj": torch.ones(3, dtype=torch.complex64).conj(),
        "quantized": torch.quantize_per_tensor(torch.ones(3), 0.1, 0, torch.qint8),
        "sparse": torch.eye(3).to_sparse(),
        "object array": np.array([{"a": 1}] * 5000, dtype=object),
        "small array": np.ones(10),
        "non-contiguous array": np.ones((100, 100))[:, ::2],
    }
    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        batch = [others]
        # tensors but nothing for the block: torch's queue
        assert sent_as_is(pack(ring, batch), batch)
        packed = pack(ring, [{**others, "plain": torch.ones(3)}])
        assert len(spans(packed)) == 1  # only the plain tensor
        assert all(packed.entries[0].skeleton[0][k] is v for k, v in others.items())
    finally:
        ring.close()
        attached.close()


def test_tensor_attributes_keep_it_with_torch():
    t = torch.ones(3)
    t.meta = "kept"  # attributes torch's pickling carries, and the block would not
    ring = Ring(Attachments().make(1, 2)[0], "test")
    batch = [t]
    assert sent_as_is(pack(ring, batch), batch)


def test_a_batch_of_small_values_is_pickled_into_a_block_unless_it_holds_tensors():
    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        small = [
            {"__key__": f"k{i}", ".cls": i, ".bin": StreamBytes(os.urandom(100))} for i in range(64)
        ]
        packed = pack(ring, small)
        assert kind(packed) == Pickled and packed.entries[0].nbytes > 64 * 100
        back = unpack(attached, packed)
        assert back == small and type(back[0][".bin"]) is StreamBytes
        nested = [{"deep": {"deeper": [torch.ones(2)]}}]  # a tensor at any depth: torch's queue
        assert sent_as_is(pack(ring, nested), nested)
        pinning = Ring(Attachments().make(1, 2)[0], "test", tensors=False)  # pin_memory
        assert sent_as_is(pack(pinning, small), small)
        pinning.close()
    finally:
        ring.close()
        attached.close()
    assert not leftover_blocks(attached.owner)


@pytest.mark.parametrize(
    "dtype", ["<f4", ">f8", "u1", "?", "<i8", "c16", "M8[ns]", [("a", "<i4"), ("b", "f2")]], ids=str
)
def test_numpy_arrays_cross_bit_for_bit(dtype):
    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        dt = np.dtype(dtype)
        n = MIN_BYTES // dt.itemsize + 3
        raw = np.random.default_rng(0).integers(0, 256, n * dt.itemsize, dtype=np.uint8)
        arrays = [raw.view(dt), raw.view(dt)[: n - n % 3].reshape(3, -1)]
        packed = pack(ring, {"arrays": arrays})
        assert len(spans(packed)) == 2
        back = unpack(attached, packed)["arrays"]
        for sent, got in zip(arrays, back, strict=True):
            assert type(got) is np.ndarray and got.dtype == sent.dtype and got.shape == sent.shape
            assert got.tobytes() == sent.tobytes() and got.flags.writeable
    finally:
        ring.close()
        attached.close()


def as_tensors(sample):
    n = sample[".json"]["id"]
    image = torch.full((3, 64, 64), float(n)) / 7  # a float image, as decoders yield
    return n, image, np.frombuffer(bytes(sample[".bin"]), np.uint8).copy(), torch.tensor(n)


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_workers_deliver_tensors_exactly_and_leave_no_blocks(tmp_path, context):
    paths = write_synthetic(tmp_path, shards=4, samples=[9, 5, 7, 3], payload_bytes=MIN_BYTES)
    dp = (
        IterableWrapper(paths).sharding_filter().open_files_by_fsspec().load_from_tar()
        .webdataset().decode().map(as_tensors).batch(4)
    )  # fmt: skip
    expected = sorted((x for b in DataLoader2(dp) for x in b), key=lambda x: x[0])
    rs = MultiProcessingReadingService(num_workers=2, multiprocessing_context=context)
    with DataLoader2(dp, reading_service=rs) as dl:
        for _ in range(2):
            got = sorted((x for b in dl for x in b), key=lambda x: x[0])
            assert [g[0] for g in got] == [e[0] for e in expected]
            for (_, *sent), (_, *came) in zip(expected, got, strict=True):
                assert same_tensor(sent[0], came[0]) and same_tensor(sent[2], came[2])
                assert came[1].tobytes() == sent[1].tobytes() and came[1].dtype == np.uint8
        assert rs._attached.blocks  # they came through shared memory
    del got, came  # values lent from the blocks keep them mapped
    assert not leftover_blocks(rs._attached.owner)


def send_then_die(x):
    if x[0] == 9:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def tensor_pair(i):
    return i, torch.full((1000,), float(i))


def test_a_worker_killed_mid_epoch_leaves_no_blocks():
    from shardpipes.errors import WorkerError

    dp = IterableWrapper(range(40)).sharding_filter().map(tensor_pair).map(send_then_die).batch(2)
    rs = MultiProcessingReadingService(num_workers=2)
    with DataLoader2(dp, reading_service=rs) as dl:
        got = []
        with pytest.raises(WorkerError, match="worker process died"):
            for batch in dl:
                got += batch
        assert got and all(torch.equal(t, torch.full((1000,), float(i))) for i, t in got)
        assert rs._attached.blocks  # batches had come through shared memory
    del got, batch  # the tensors lent from the blocks keep them mapped
    assert not leftover_blocks(rs._attached.owner)


def test_without_tensors_a_ring_leaves_them_to_torch():
    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner, tensors=False)
    try:
        t, big = torch.ones(3), os.urandom(MIN_BYTES)
        packed = pack(ring, [{"x": t, "b": big}])
        assert len(spans(packed)) == 1  # the bytes only
        assert packed.entries[0].skeleton[0]["x"] is t
        only = [{"x": t}]
        assert sent_as_is(pack(ring, only), only)
    finally:
        ring.close()
        attached.close()


@pytest.mark.filterwarnings("ignore:.*pin_memory.*:UserWarning")
def test_with_pin_memory_tensors_are_left_to_torchs_queues_and_its_pin_thread():
    dp = IterableWrapper(range(8)).sharding_filter().map(tensor_pair).batch(2)
    rs = MultiProcessingReadingService(num_workers=2, pin_memory=True)
    with DataLoader2(dp, reading_service=rs) as dl:
        got = sorted((i, t) for b in dl for i, t in b)
        assert not rs._attached.blocks  # torch's pin thread saw real tensors
    assert [i for i, _ in got] == list(range(8))
    assert all(torch.equal(t, torch.full((1000,), float(i))) for i, t in got)


def test_tensors_and_arrays_are_lent_from_the_block_until_they_are_gone():
    """No copy in the main process: each tensor owns a storage of exactly its bytes in the
    block, the block is not written again while any of them lives, and is free once all are."""
    import gc

    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        images = [torch.rand(3, 40, 40) for _ in range(4)]
        array = np.arange(MIN_BYTES, dtype=np.int32).reshape(-1, 8)
        batch = [{"img": t, "arr": array if i == 0 else None} for i, t in enumerate(images)]
        back = unpack(attached, pack(ring, batch))
        first = back[0]["img"]
        assert all(torch.equal(b["img"], t) for b, t in zip(back, images, strict=True))
        assert np.array_equal(back[0]["arr"], array) and back[0]["arr"].dtype == array.dtype
        assert back[0]["arr"].flags.writeable  # as the worker's own array was
        # its own storage, exactly its bytes, as the worker's tensor had (torch.save writes
        # only them, not the block)
        assert first.untyped_storage().nbytes() == first.nbytes and first.storage_offset() == 0
        assert first._base is None and first.is_contiguous()
        # the block is lent: the ring writes its other block, then has none free
        other = [torch.ones(5000)]
        assert kind(pack(ring, other)) == Skeleton
        third = [torch.zeros(5000)]
        assert pack(ring, third).name is None  # no block free: with the message
        kept = first.clone()
        del back, batch
        gc.collect()
        assert torch.equal(first, kept)  # one value still alive: still lent, intact
        assert pack(ring, third).name is None
        del first
        gc.collect()
        packed = pack(ring, third)  # every value gone: the block is free again
        assert kind(packed) == Skeleton
        assert torch.equal(unpack(attached, packed)[0], third[0])
    finally:
        ring.close()
        attached.close()
    assert not leftover_blocks(attached.owner)


def test_values_lent_from_a_closed_loader_stay_valid():
    attached = Attachments()
    ring = Ring(attached.make(1, 1)[0], attached.owner)
    image = torch.rand(3, 64, 64)
    back = unpack(attached, pack(ring, [image]))
    ring.close()  # the workers stop,
    attached.close()  # and the loader shuts down while the training loop still holds a batch
    assert not named_blocks(_prefix())  # no name, the map stays
    assert torch.equal(back[0], image)
    back[0].add_(1)  # still writable memory of this process
    assert torch.allclose(back[0], image + 1)
    del back
    assert not leftover_blocks()  # the last value gone, the memory goes


def _image(i):
    g = torch.Generator().manual_seed(i)
    return {"i": i, "img": torch.rand(3, 32, 32, generator=g)}


def test_workers_lend_tensors_and_batches_kept_by_the_loop_stay_exact():
    """The training loop keeps every batch (more than the workers' blocks): each stays exactly
    what its worker made, the overflow travelling through torch's queues instead."""
    dp = IterableWrapper(range(200)).sharding_filter().map(_image).batch(8)
    rs = MultiProcessingReadingService(num_workers=2)
    with DataLoader2(dp, reading_service=rs) as dl:
        owner = rs._attached.owner
        for epoch in range(2):
            kept = list(dl)
            assert sorted(s["i"] for b in kept for s in b) == list(range(200))
            for b in kept:
                for s in b:
                    assert torch.equal(s["img"], _image(s["i"])["img"]), (epoch, s["i"])
            del kept, b, s  # the tensors lent from the blocks keep them mapped
    assert not leftover_blocks(owner)


def test_a_block_is_chosen_by_what_its_values_take_once_aligned():
    """Each value starts at a multiple of 64 bytes: thousands of 1-byte tensors take 64 each.
    The block must be chosen by that, not by the values' own sizes, or writing runs past it."""
    attached = Attachments()
    ring = Ring(attached.make(1, 1)[0], attached.owner)
    try:
        unpack(attached, pack(ring, [os.urandom(MIN_BYTES)]))  # an 8 MiB block, free again
        bigs = [os.urandom(MIN_BYTES + 1) for _ in range(250)]  # 8.2 MB, 8.21 MB aligned
        tiny = [torch.tensor([i % 256], dtype=torch.uint8) for i in range(3000)]  # 3 KB, 192 KB
        packed = pack(ring, bigs + tiny)
        assert kind(packed) == Skeleton and ring.blocks[0].size > 8 << 20  # a larger block
        back = unpack(attached, packed)
        assert back[:250] == bigs
        assert all(torch.equal(a, b) for a, b in zip(back[250:], tiny, strict=True))
    finally:
        ring.close()
        attached.close()
