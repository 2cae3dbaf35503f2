"""Several items per worker message, dealt out one by one in the order of one item per message."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._utils import ExceptionWrapper

from _hyp import budget
from shardpipes.dataloader2 import DataLoader2, MultiProcessingReadingService
from shardpipes.dataloader2.workers import bundles as _bundle
from shardpipes.dataloader2.workers.attachments import Attachments
from shardpipes.dataloader2.workers.bundles import MAX_BUNDLE, Bundle, Interleave
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.handlers import SkipStats


def round_robin(streams: list[list]) -> list:
    """torch's in-order round-robin with one item per message: worker 0's next, worker 1's, ...
    a worker leaving the rotation when it has no more."""
    out, at = [], [0] * len(streams)
    active = list(range(len(streams)))
    while active:
        for w in list(active):
            if at[w] == len(streams[w]):
                active.remove(w)
                continue
            out.append(streams[w][at[w]])
            at[w] += 1
    return out


def messages(bundled: list[list[Bundle]]):
    """The order torch delivers messages in: round-robin over the workers, by message."""
    return iter(round_robin(bundled))


def cut(items: list, sizes: list[int]) -> list[list]:
    """``items`` in consecutive pieces of ``sizes`` (cycled), the last one shorter."""
    out, at, i = [], 0, 0
    while at < len(items):
        n = sizes[i % len(sizes)]
        out.append(items[at : at + n])
        at += n
        i += 1
    return out


def skip_state(n: int) -> dict:
    return {"samples": n, "shards": 0, "examples": []}


@st.composite
def workers(draw):
    """Per worker: its items, where its skip counters moved, and how its items were bundled."""
    out = []
    for w in range(draw(st.integers(1, 4))):
        n = draw(st.integers(0, 25))
        items = [(w, i) for i in range(n)]
        moved = sorted(draw(st.sets(st.integers(0, n), max_size=4)))
        sizes = draw(st.lists(st.integers(1, 6), min_size=1, max_size=4))
        out.append((items, moved, sizes))
    return out


@settings(max_examples=budget(300), deadline=None)
@given(workers(), st.booleans())
def test_any_bundling_yields_the_order_and_counters_of_one_item_per_message(spec, same_size):
    """Whatever sizes the bundles have (the same for all workers or not), the items come in
    the order of one item per message, and after each one the worker's skip counters are
    those it had when it made that item."""
    if same_size:
        spec = [(items, moved, spec[0][2]) for items, moved, _ in spec]
    bundled, expected_counters = [], {}
    for w, (items, moved, sizes) in enumerate(spec):
        # the counters moved to len(moved[:k]) after the first moved[k] items
        def after(n, moved=moved):
            return sum(1 for m in moved if m <= n)

        for n in range(1, len(items) + 1):
            expected_counters[items[n - 1]] = after(n)
        pieces = cut(items, sizes) or [[]]
        worker_bundles, done = [], 0
        for k, piece in enumerate(pieces):
            last = k == len(pieces) - 1
            lo = done
            done += len(piece)
            skips = [(m - lo, skip_state(after(m))) for m in moved if lo < m <= done]
            if last:
                skips += [(m - lo, skip_state(after(m))) for m in moved if m > done]
            if lo == 0:  # a move before the first item shows with it
                skips = [(0, skip_state(after(0)))] * bool(after(0)) + skips
            worker_bundles.append(
                Bundle(w, piece, len(piece), skips, [[w]] if last else None, None, 0.0, 0)
            )
        bundled.append(worker_bundles)
    interleave = Interleave(np.ones(1, dtype=np.int64), Attachments())
    got = []
    for item in interleave.items(messages(bundled), len(spec)):
        got.append(item)
        seen = interleave.skips.get(item[0], {"samples": 0})["samples"]
        assert seen == expected_counters[item], item
    assert got == round_robin([items for items, _, _ in spec])
    assert interleave.flows == {w: [[w]] for w in range(len(spec))}
    for w, (_, moved, _) in enumerate(spec):
        assert interleave.skips.get(w, {"samples": 0})["samples"] == len(moved)


def test_an_error_is_raised_after_the_items_made_before_it():
    def wrapped(msg):
        try:
            raise ValueError(msg)
        except ValueError:
            return ExceptionWrapper(where="in DataLoader worker process 1")

    bundled = [
        [Bundle(0, [0, 2, 4], 3, [], None, None, 0.0, 0), Bundle(0, [6], 1, [], [], None, 0.0, 0)],
        [Bundle(1, [1], 1, [], None, wrapped("bad sample"), 0.0, 0)],
    ]
    got = []
    interleave = Interleave(np.ones(1, dtype=np.int64), Attachments())
    with pytest.raises(ValueError, match="bad sample"):
        for item in interleave.items(messages(bundled), 2):
            got.append(item)  # noqa: PERF402 - what came before the error
    assert got == [0, 1, 2]  # worker 1's error comes where its next item would have


def test_a_bundle_grows_to_about_10_ms_of_work_within_8_mb_after_two_agree():
    size = np.ones(1, dtype=np.int64)
    interleave = Interleave(size, Attachments())

    def seen(count, cost, nbytes):
        """The size after a bundle of ``count`` items, ``cost`` seconds each, ``nbytes`` in all."""
        interleave._grow(Bundle(0, [], count, [], None, None, cost, nbytes))
        return int(size[0])

    assert seen(1, 1e-4, 1000) == 1  # one cheap bundle is not enough
    assert seen(1, 1e-4, 1000) == MAX_BUNDLE  # two: as large as allowed
    assert seen(16, 0.02, 16 * 1000) == MAX_BUNDLE  # within an epoch it only grows
    interleave.start_epoch()
    assert int(size[0]) == 1  # ... the next epoch starts where the last bundles were
    for _ in range(2):
        seen(1, 2e-3, 0)  # 2 ms items: 8 make 16 ms, the first power of two past 10 ms
    assert int(size[0]) == 8
    size[0] = 1
    for _ in range(2):
        seen(1, 1e-6, 700 << 10)  # 700 KB items: two per bundle fit in BUNDLE_BYTES (2 MB)
    assert int(size[0]) == 2
    size[0] = 1
    for _ in range(2):
        seen(1, 1e-6, -1)  # items with large values sent another way: one per message
    assert int(size[0]) == 1


def _sample(i):
    return {"__key__": str(i), "__url__": "/data/s.tar", ".json": b"{" if i % 10 == 3 else b"{}"}


def _key(sample):
    return int(sample["__key__"])


def _run(n, workers):
    """Batches of the loader, and the skip count the loader reports after each."""
    # every 10th sample cannot be decoded: skipped and counted in the workers
    dp = (
        IterableWrapper([_sample(i) for i in range(n)])
        .sharding_filter()
        .decode(handler="skip")
        .map(_key)
        .batch(3)
    )
    out = []
    with DataLoader2(dp, reading_service=MultiProcessingReadingService(num_workers=workers)) as dl:
        for epoch in range(2):
            for batch in dl:
                out.append((epoch, batch, dl.state_dict()["skipped"]))
    return out


@pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
@pytest.mark.parametrize("workers", [2, 3])
def test_a_loader_yields_the_same_batches_and_counts_whatever_the_bundle_size(monkeypatch, workers):
    """With one item per message (what torch does) and with bundles as large as allowed from
    the second message on, the same batches in the same order, and the same skip counts at
    every step (what a checkpoint records)."""
    monkeypatch.setattr(_bundle, "MAX_BUNDLE", 1)
    one = _run(400, workers)
    monkeypatch.setattr(_bundle, "MAX_BUNDLE", 16)
    monkeypatch.setattr(_bundle, "BUNDLE_SECONDS", 1e9)  # grow whatever the machine's speed
    bundled = _run(400, workers)
    assert bundled == one
    assert one[-1][2] == 40  # every 10th item skipped, per epoch, counted
    kept = [[i for i in range(w, 400, workers) if i % 10 != 3] for w in range(workers)]
    per_worker = [[ks[j : j + 3] for j in range(0, len(ks), 3)] for ks in kept]
    assert [b for e, b, _ in one if e == 0] == round_robin(per_worker)
    assert [b for e, b, _ in one if e == 0] == [b for e, b, _ in one if e == 1]


@pytest.mark.parametrize("context", ["fork", "spawn"])
def test_bundles_grow_on_a_real_loader_and_messages_are_fewer(monkeypatch, context):
    """The size the main process sets reaches the workers, whether forked or spawned."""
    monkeypatch.setattr(_bundle, "BUNDLE_SECONDS", 1e9)
    taken = []
    take = Interleave._take

    def counting(self, bundle, queues):
        taken.append(bundle.count)
        return take(self, bundle, queues)

    monkeypatch.setattr(Interleave, "_take", counting)
    dp = IterableWrapper(range(2000)).sharding_filter().batch(4)
    rs = MultiProcessingReadingService(num_workers=2, multiprocessing_context=context)
    with DataLoader2(dp, reading_service=rs) as dl:
        assert sorted(x for b in dl for x in b) == list(range(2000))
        assert int(rs._slot.bundle[0]) == MAX_BUNDLE
    assert sum(taken) == 500 and len(taken) < 500 // 4
    assert SkipStats() == rs.skipped()


class Pinnable:
    """A value torch's pin thread pins by calling its ``pin_memory()`` (as it does a tensor)."""

    def __init__(self, pinned=False):
        self.pinned = pinned

    def pin_memory(self):
        return Pinnable(pinned=True)


def test_pinning_a_bundle_pins_what_was_not_pickled():
    """With ``pin_memory=True`` torch's pin thread gets bundles: the items sent as they are and
    the skeletons of those whose large values are in the block hold the tensors to pin."""
    from shardpipes.dataloader2.workers.messages import AsIs, Inline, Values
    from shardpipes.dataloader2.workers.packed import Packed

    packed = Packed(None, 0, [AsIs([Pinnable()]), Values([Pinnable()], ()), Inline(b"pickled")])
    pinned = Bundle(0, packed, 3, [], None, None, 0.0, 0).pin_memory()
    as_is, values, inline = pinned.payload.entries
    assert (type(as_is), type(values), type(inline)) == (AsIs, Values, Inline)
    assert as_is.item[0].pinned and values.skeleton[0].pinned and values.spans == ()
    assert inline.pickled == b"pickled"
    plain = Bundle(0, [Pinnable()], 1, [], None, None, 0.0, -1).pin_memory()  # no ring
    assert plain.payload[0].pinned and plain.count == 1


def test_with_a_timeout_workers_send_one_item_per_message(monkeypatch):
    monkeypatch.setattr(_bundle, "BUNDLE_SECONDS", 1e9)
    dp = IterableWrapper(range(400)).sharding_filter().batch(4)
    rs = MultiProcessingReadingService(num_workers=2, timeout=30)
    with DataLoader2(dp, reading_service=rs) as dl:
        assert sorted(x for b in dl for x in b) == list(range(400))
        assert int(rs._slot.bundle[0]) == 1


def _payload(i: int) -> dict:
    return {"i": i, "x": bytes(20_000)}  # large enough to go into the worker's blocks


def test_blocks_of_messages_dropped_unread_go_back_to_the_worker(monkeypatch):
    """A loop that leaves each epoch early (a validation limit, ``limit_train_batches``) makes
    torch drain the messages in flight when the pool starts the next epoch: their blocks go
    back to the worker, which keeps sending batches through its blocks (before, after a few
    such epochs every batch was pickled)."""
    from shardpipes.dataloader2.workers import attachments as _shm

    kinds = []
    reader = _shm.Attachments.reader

    def seeing(self, bundled):
        kinds.append(bundled.name is not None)
        return reader(self, bundled)

    monkeypatch.setattr(_shm.Attachments, "reader", seeing)
    dp = IterableWrapper(range(2000)).sharding_filter().map(_payload).batch(8)
    rs = MultiProcessingReadingService(num_workers=1)
    with DataLoader2(dp, reading_service=rs) as dl:
        for _ in range(12):  # far more epochs than the worker has blocks
            for step, _batch in enumerate(dl):
                if step == 3:
                    break
        kinds.clear()
        assert sorted(s["i"] for b in dl for s in b) == list(range(2000))
    assert kinds and all(kinds)  # every message of the whole epoch through a block


def test_a_message_dropped_unread_frees_its_block_and_a_read_one_waits_for_its_values():
    import pickle

    from shardpipes.dataloader2.workers.packed import SEQ as _SEQ
    from shardpipes.dataloader2.workers.ring import Ring

    attached = Attachments()
    ring = Ring(attached.make(1, 2)[0], attached.owner)
    try:
        sent = ring.pack([np.arange(100_000)])
        block = next(b for b in ring.blocks if b is not None and b.name == sent.name)
        head, seq = block.buf, sent.seq

        def free():
            return _SEQ.unpack_from(head, 8)[0] == seq

        received = pickle.loads(pickle.dumps(sent))
        del received  # dropped unread: the block is free
        assert free()
        _SEQ.pack_into(head, 8, -1)  # as if busy again, to see the next one
        received = pickle.loads(pickle.dumps(sent))
        value = attached.reader(received).load(0)
        del received
        assert not free()  # read, and its array lent from the block still lives
        assert value.sum() == sum(range(100_000))
        del value
        assert free()
        del sent  # the worker's own copy gives nothing back
    finally:
        ring.close()
        attached.close()
