"""Large payloads cross from workers through reused shared memory, and arrive unchanged."""

from __future__ import annotations

import os

import pytest
from torch.utils.data.datapipes.datapipe import DataChunk

from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2._shm import MIN_BYTES, PREFIX, Attachments, Packed, Ring
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.formats.stream import StreamBytes
from shardpipes.synthetic import write_synthetic


def leftover_blocks() -> list[str]:
    return [n for n in os.listdir("/dev/shm") if n.startswith(PREFIX)]


def test_pack_and_unpack_give_back_the_same_batch():
    big, small = os.urandom(MIN_BYTES), b"x" * 10
    batch = DataChunk([{"__key__": "a", ".bin": big, ".txt": small}, {".bin": big + b"!"}])
    attached = Attachments()
    ring = Ring(slots=3, owner=attached.owner)
    try:
        packed = ring.pack(batch)
        assert type(packed) is Packed and len(packed.spans) == 2
        assert all(len(v) < 100 for v in packed.item[0].values() if isinstance(v, bytes))
        back = attached.unpack(packed)
        assert back == batch and type(back) is DataChunk
        assert type(back[0][".bin"]) is bytes
        plain = [{"a": small}, (1, 2)]
        assert ring.pack(plain) is plain  # nothing large: sent as it is
        for i in range(5):  # the ring wraps around and keeps serving exact copies
            item = (os.urandom(MIN_BYTES + i), i)
            assert attached.unpack(ring.pack(item)) == item
    finally:
        attached.close()
    assert not leftover_blocks()


def test_a_batch_larger_than_its_block_is_pickled_instead():
    attached = Attachments()
    ring = Ring(slots=2, owner=attached.owner)
    try:
        first = [b"a" * MIN_BYTES]
        attached.unpack(ring.pack(first))  # makes the block of ring slot 1 (8 MiB)
        attached.unpack(ring.pack(first))  # slot 0
        huge = [os.urandom(9 << 20)]
        assert ring.pack(huge) is huge
    finally:
        attached.close()


def test_a_block_not_yet_copied_out_is_not_written_again():
    """More batches in flight than blocks (all requests going to one worker at the end of an
    epoch): the batch that finds its block still in use is pickled instead."""
    attached = Attachments()
    ring = Ring(slots=1, owner=attached.owner)
    try:
        first = [os.urandom(MIN_BYTES)]
        packed = ring.pack(first)
        second = [os.urandom(MIN_BYTES)]
        assert ring.pack(second) is second  # the only block still holds `first`
        assert attached.unpack(packed) == first  # intact
        assert type(ring.pack(second)) is Packed  # copied out: the block is free again
    finally:
        attached.close()


def test_an_overwritten_block_is_detected():
    import struct

    attached = Attachments()
    ring = Ring(slots=1, owner=attached.owner)
    try:
        packed = ring.pack([os.urandom(MIN_BYTES)])
        block = ring.blocks[0]
        struct.pack_into("<q", block.buf, 0, packed.seq + 1)  # as if written again too early
        with pytest.raises(RuntimeError, match="overwritten"):
            attached.unpack(packed)
    finally:
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
    assert not leftover_blocks()


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


def test_without_shared_memory_batches_are_pickled(monkeypatch):
    from multiprocessing import shared_memory

    def refuse(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(shared_memory, "SharedMemory", refuse)
    ring = Ring(slots=2, owner="test")
    item = [os.urandom(MIN_BYTES)]
    assert ring.pack(item) is item and ring.broken
    assert ring.pack(item) is item  # it does not try again for every batch


_FAULTS_PER_BATCH = """
import os, resource
from shardpipes.dataloader2._shm import Attachments, Ring
attached = Attachments()
ring = Ring(slots=3, owner=attached.owner)
batch = [{".bin": os.urandom(100_000)} for _ in range(64)]  # the large preset: 6.4 MB
try:
    for i in range(33):
        if i == 3:
            before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        out = attached.unpack(ring.pack(batch))
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
