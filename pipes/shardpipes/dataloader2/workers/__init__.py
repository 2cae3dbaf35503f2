"""The worker transport: what runs in worker processes and how their items reach the main process.

``MultiProcessingReadingService`` runs the graph in torchdata's ``StatefulDataLoader`` (the pool,
docs/worker-pool.md says why); this package is what shardpipes adds to it, one concern a module:

- ``dataset.py``: the dataset each worker iterates (its own copy of the graph, sharded and seeded
  from the epoch's plan, read from a small shared-memory record).
- ``bundles.py``: several items per message from a worker, dealt out again in the main process
  in the order of one item per message.
- ``messages.py``: what crosses processes, as named, frozen values: how each item travels (an
  entry) and where each of its large values is (a span).
- ``values.py``: which values of a batch travel through a block; writing, copying, lending them.
- ``blocks.py``: the blocks themselves, made by the main process before the workers start,
  without a name that could outlive the job (the kernel frees them with the last process).
- ``packed.py``, ``ring.py``, ``attachments.py``: the message naming a block, the worker's ring of
  reused blocks, and the main process's side (mapping the blocks, reading items out of them).
- ``pool.py``: the stages that stand, in the main process, for the part of the graph in workers.
- ``graph_copy.py``: a worker's copy of the graph, keeping multiprocessing's shared objects shared.

Why shared memory: a batch of 64 samples of 100 KB is 6.4 MB; pickled into a worker's result
pipe it is copied four times, and the pipe's 64 KB kernel buffer makes the two processes take
turns every 64 KB. A tensor is worse: torch's queues move every tensor of a batch into a
shared-memory segment of its own, made for it, filled (faulting fresh pages in) and passed as a
file descriptor over a socket, then mapped by the main process: about 650 us of a worker's CPU
for a 224x224 float image (docs/performance.md), more than decoding the JPEG it came from. A
torch shared-memory storage per batch was tried first: passing a new storage through torch's
queues cost more than pickling the bytes. So each worker reuses a few blocks, batch after batch.
"""

__all__: list[str] = []
