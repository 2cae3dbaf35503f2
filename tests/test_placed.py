"""Large members no worker stage reads are sent by their place and read once, by the main process."""

from __future__ import annotations

import gc
import multiprocessing
import os
import pickle
from concurrent.futures import ThreadPoolExecutor

import pytest

from _graphs import resumed, uninterrupted
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2.workers.attachments import Attachments
from shardpipes.dataloader2.workers.messages import PlaceSpan, Skeleton
from shardpipes.dataloader2.workers.ring import Ring
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.errors import MissingShardError, ShardReadError
from shardpipes.formats import placed
from shardpipes.formats.placed import MIN_BYTES, PlacedBytes
from shardpipes.formats.stream import StreamBytes
from shardpipes.index import build_index, default_index_url
from shardpipes.synthetic import write_synthetic


def _placed_value(tmp_path, data: bytes, at: int = 7) -> tuple[str, PlacedBytes]:
    os.makedirs(tmp_path, exist_ok=True)
    path = str(tmp_path / "shard.tar")
    with open(path, "wb") as f:
        f.write(b"h" * at + data + b"t" * 5)
        f.flush()
        held = placed.Held(f.fileno())  # as a worker holds the file it mapped
    place = placed.place_of_file(path, "file://" + path, held)
    return path, PlacedBytes(place, at, len(data), held)


def test_a_placed_value_is_read_on_first_use_and_then_is_a_streambytes(tmp_path):
    data = os.urandom(MIN_BYTES + 3)
    _, v = _placed_value(tmp_path, data)
    assert len(v) == len(data) and placed.unread(v)  # its size is known without reading
    assert v == data and not placed.unread(v)
    assert bytes(v) == data and v[:4] == data[:4] and v.read(2) == data[:2]
    back = pickle.loads(pickle.dumps(v))
    assert type(back) is StreamBytes and back == data
    _, w = _placed_value(tmp_path, data)
    assert type(pickle.loads(pickle.dumps(w))) is StreamBytes  # pickling an unread one reads it
    assert isinstance(w, StreamBytes) and not placed.unread(w)
    placed.close_files()


def test_a_file_changed_after_it_was_mapped_is_refused_with_its_url_and_offset(tmp_path):
    path, v = _placed_value(tmp_path, os.urandom(100), at=512)
    placed.close_files()
    with open(path, "ab") as f:  # changed in place: the file held open changed too
        f.write(b"more")
    with pytest.raises(ShardReadError, match=r"changed since it was read.*byte offset 512") as e:
        bytes(v)
    assert e.value.url == "file://" + path and e.value.offset == 512


def _let_go(v: PlacedBytes) -> None:
    """Drop the worker's hold on ``v``'s file (as when it was held by a worker that is gone)."""
    v.held = None
    gc.collect()


@pytest.mark.parametrize("how", ["deleted", "replaced"])
def test_a_file_deleted_or_replaced_is_read_from_the_descriptor_held_open(tmp_path, how):
    data = os.urandom(100)
    path, v = _placed_value(tmp_path, data)
    _, w = _placed_value(tmp_path / "w", data)
    placed.close_files()
    for p in (path, str(tmp_path / "w" / "shard.tar")):
        if how == "deleted":  # as a cache evicting it would
            os.unlink(p)
        else:  # another file of the same size at the same path
            os.replace(_placed_value(tmp_path / "other", os.urandom(100))[0], p)
    assert bytes(v) == data  # from /proc/<pid>/fd/<n>: the file that was mapped
    placed.close_files()
    _let_go(w)
    error = MissingShardError if how == "deleted" else ShardReadError
    message = "is gone since" if how == "deleted" else "changed since it was read"
    with pytest.raises(error, match=message):
        bytes(w)


def test_the_files_kept_open_are_bounded_and_closed(tmp_path):
    placed.close_files()
    values = [
        _placed_value(tmp_path / str(i), bytes([i]) * 10)[1] for i in range(placed.MAX_FILES + 9)
    ]
    before = len(os.listdir("/proc/self/fd"))
    assert [bytes(v) for v in values] == [bytes([i]) * 10 for i in range(len(values))]
    assert len(placed._files) == placed.MAX_FILES
    # A value read lets go of its hold on the file (closed); read_at keeps MAX_FILES open.
    n = len(values)
    assert len(os.listdir("/proc/self/fd")) == before - n + placed.MAX_FILES
    placed.close_files()
    assert len(os.listdir("/proc/self/fd")) == before - n


def _child_state(queue) -> None:
    queue.put((len(placed._files), len(placed._places)))


def test_a_forked_process_starts_without_the_parents_files(tmp_path):
    _, v = _placed_value(tmp_path, b"x" * 10)
    bytes(v)
    assert placed._files
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    child = ctx.Process(target=_child_state, args=(queue,))
    child.start()
    assert queue.get(timeout=60) == (0, 0)
    child.join(60)
    placed.close_files()


def _payload(sample: dict) -> tuple[str, bytes]:
    return sample["__key__"], sample[".bin"]


def _length(sample: dict) -> dict:
    return {**sample, "n": len(bytes(sample[".bin"]))}  # a worker stage that reads the value


def _graph(paths: list[str], index: bool, reads: bool):
    urls = IterableWrapper(paths)
    dp = (
        (urls.sharding_by_index() if index else urls.sharding_filter())
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode()
    )
    if reads:
        dp = dp.map(_length)
    return dp.shuffle(buffer_size=5).batch(3)


@pytest.mark.parametrize("index", [False, True], ids=["files", "index ranges"])
@pytest.mark.parametrize("reads", [False, True], ids=["unread", "read in the worker"])
def test_workers_send_large_members_by_place_and_the_loop_gets_the_same_values(
    tmp_path, monkeypatch, index, reads
):
    paths = write_synthetic(tmp_path, shards=4, samples=[6, 5, 7, 3], payload_bytes=MIN_BYTES + 1)
    write_synthetic(tmp_path / "small", shards=1, samples=4, payload_bytes=MIN_BYTES - 1)
    paths += sorted(str(tmp_path / "small" / n) for n in os.listdir(tmp_path / "small"))
    if index:
        build_index(paths, progress=False).save(default_index_url(paths))
    dp = _graph(paths, index, reads)
    expected = {(s["__url__"], s["__key__"]): s for b in DataLoader2(dp) for s in b}
    assert all(type(s[".bin"]) is StreamBytes for s in expected.values())  # in-process: copies
    reads_here: list[int] = []
    read_at = placed.read_at

    def counted(place, offset, size):  # counts the main process's reads
        reads_here.append(size)
        return read_at(place, offset, size)

    monkeypatch.setattr(placed, "read_at", counted)
    rs = MultiProcessingReadingService(num_workers=2)
    large = MIN_BYTES + 1
    delivered = []
    with DataLoader2(dp, reading_service=rs) as dl:
        for _ in range(2):
            got = [s for b in dl for s in b]
            # (by index, the plan gives both workers the same count: 24 of the 25)
            assert len(got) == len(expected) - index
            for s in got:
                want = expected[s["__url__"], s["__key__"]]
                assert s == want and type(s[".bin"]) is StreamBytes  # as in-process
            delivered += [len(s[".bin"]) for s in got if len(s[".bin"]) == large]
    # Unread large members were read here, once each; small ones, and those a worker stage
    # read, came as bytes.
    assert len(delivered) >= 40
    assert reads_here == ([] if reads else delivered)


def test_a_span_of_a_place_carries_no_bytes_in_the_block(tmp_path):
    data = os.urandom(MIN_BYTES * 2)
    _, v = _placed_value(tmp_path, data)
    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        packed = ring.pack([[{"x": v, "y": 1}]])
        (entry,) = packed.entries
        assert type(entry) is Skeleton
        assert entry.spans == (PlaceSpan(v.place, 7, len(data)),)
        assert placed.unread(v)  # the worker did not read it
        (back,) = attached.unpack(packed)
        assert back == [{"x": data, "y": 1}] and type(back[0]["x"]) is StreamBytes
    finally:
        ring.close()
        attached.close()


def test_two_workers_reading_ranges_of_one_shard_send_places_at_the_right_offsets(
    tmp_path, monkeypatch
):
    # One shard and an index: each worker maps its own byte range of the shard (a map that
    # starts past the shard's first byte), and places count from the shard's start.
    paths = write_synthetic(tmp_path, shards=1, samples=50, payload_bytes=MIN_BYTES + 8)
    build_index(paths, progress=False).save(default_index_url(paths))
    dp = _graph(paths, index=True, reads=False)
    expected = {s["__key__"]: bytes(s[".bin"]) for b in DataLoader2(dp) for s in b}
    register = placed.register

    def noted(mapped, path, url, fd, origin=0, mapped_as=None):
        with open(tmp_path / "origins", "a") as f:  # written by the workers
            f.write(f"{origin}\n")
        register(mapped, path, url, fd, origin, mapped_as)

    monkeypatch.setattr(placed, "register", noted)
    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=2)) as dl:
        got = {s["__key__"]: s[".bin"] for b in dl for s in b}
    assert got == expected
    origins = [int(x) for x in (tmp_path / "origins").read_text().split()]
    assert len(origins) == 2 and max(origins) > 0


def test_a_shard_deleted_mid_epoch_is_still_read_from_the_worker_that_holds_it(tmp_path):
    # A cache may evict a shard while members of it wait in a worker's shuffle buffer or in
    # batches on their way: the main process reads them from the worker's open file.
    paths = write_synthetic(tmp_path, shards=1, samples=30, payload_bytes=MIN_BYTES + 5)
    dp = (
        IterableWrapper(paths)
        .sharding_filter()
        .open_files_by_fsspec(mode="rb")
        .load_from_tar()
        .webdataset()
        .decode()
        .shuffle(buffer_size=100)
        .batch(4)
    )  # fmt: skip  (the buffer holds the whole shard before the first batch)
    expected = {s["__key__"]: bytes(s[".bin"]) for b in DataLoader2(dp) for s in b}
    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=1)) as dl:
        it = iter(dl)
        got = {s["__key__"]: s[".bin"] for s in next(it)}
        os.unlink(paths[0])
        placed.close_files()  # nor does the main process hold it open any more
        got.update((s["__key__"], s[".bin"]) for b in it for s in b)
    assert got == expected


def test_threads_read_at_once_and_a_file_closes_when_its_last_read_is_done(tmp_path):
    data = os.urandom(MIN_BYTES)
    values = [_placed_value(tmp_path / str(i), data)[1] for i in range(placed.MAX_FILES * 2)]
    placed.close_files()
    with ThreadPoolExecutor(8) as pool:  # more files than are kept: reads evict each other's
        assert list(pool.map(bytes, values)) == [data] * len(values)
    assert len(placed._files) == placed.MAX_FILES
    assert not any(f.users or f.closing for f in placed._files.values())
    placed.close_files()


def test_a_resumed_loader_yields_the_same_placed_values(tmp_path):
    # Exact mid-epoch resume with large members crossing by place: the same samples, the
    # same bytes, in the same order as the uninterrupted run from that point.
    paths = write_synthetic(tmp_path, shards=3, samples=[9, 6, 8], payload_bytes=MIN_BYTES + 3)
    dp = _graph(paths, index=False, reads=False)

    def rs():
        return MultiProcessingReadingService(num_workers=2)

    batches, states = uninterrupted(dp, rs(), epochs=2)
    for k in (2, 7):
        got = resumed(dp, rs(), states[k], len(batches) - k)
        assert got == batches[k:]
        assert all(type(s[".bin"]) is StreamBytes for b in got for s in b)
