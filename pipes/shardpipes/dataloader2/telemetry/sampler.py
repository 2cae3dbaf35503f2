"""Where one thread's CPU goes, stage by stage, from samples of its stack.

A thread of its own wakes every ``interval`` seconds, reads the CPU clock of the thread that
runs the graph, and gives the CPU spent since its last look to the innermost stage on that
thread's stack (a stage's code is on the stack while the stage, or a function it calls, runs).
Nothing is added to the path of a sample, and nothing runs when telemetry is off, since then
no sampler exists.

A look itself takes about a microsecond, but waking a thread and taking the GIL from the one
that runs the graph costs more, and far more on a loaded machine (measured at 120-170 us a look
on two cores shared by a dozen busy processes). So the sampler keeps its own CPU clock and
waits longer between looks whenever its CPU would exceed :data:`BUDGET` of the CPU it samples:
its cost stays within the budget on any machine, and on a loaded one it looks less often.

The figures are statistical: a stage that takes a share ``p`` of the thread's CPU gets close
to ``p`` of the samples once there are a few dozen of them.
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import CodeType, FrameType
from typing import Any

from torch.utils.data import IterDataPipe

from shardpipes.dataloader2.graph import stages_of
from shardpipes.dataloader2.telemetry.names import stage_labels

__all__ = ["BUDGET", "LOADER", "MAX_WAIT", "StageSampler", "next_wait", "thread_cpu_clock"]

#: The sampler's own CPU is kept under this share of the CPU of the thread it samples.
BUDGET = 0.003
#: Longest wait between two looks, when the budget stretches it (seconds).
MAX_WAIT = 1.0

#: The label of CPU spent outside any stage: a worker's loop (sending batches), the main
#: process receiving them, the loader's own work per batch.
LOADER = "(loader)"


def next_wait(
    wait: float,
    own_cpu: float,
    sampled_cpu: float,
    *,
    interval: float,
    budget: float,
    max_wait: float = MAX_WAIT,
) -> float:
    """The sampler's budget rule: how long to wait before the next look.

    ``own_cpu`` is what the looks cost so far, ``sampled_cpu`` the CPU of the sampled thread
    they covered. Over budget (``own_cpu > budget * sampled_cpu``) the wait doubles, up to
    ``max_wait`` (or ``interval`` when that is longer); within it, the wait halves, down to
    ``interval``. So the looks cost at most ``budget`` of the sampled CPU plus the cost of a
    few looks (``tests/test_telemetry.py`` states the bound), and a sampler that can look
    every ``interval`` within its budget does.
    """
    if own_cpu > budget * sampled_cpu:
        return min(2 * wait, max(max_wait, interval))
    return max(wait / 2, interval)


def thread_cpu_clock(thread_id: int) -> Callable[[], float]:
    """A function that reads the CPU time of thread ``thread_id`` (process CPU where unsupported)."""
    try:
        clock = time.pthread_getcpuclockid(thread_id)
    except (AttributeError, OSError):
        return time.process_time
    return lambda: time.clock_gettime(clock)


def _functions(value: Any, depth: int = 0) -> Iterator[Any]:
    """The functions behind a class attribute: unwrapped, and those a wrapper closes over."""
    if isinstance(value, staticmethod | classmethod):
        value = value.__func__
    elif isinstance(value, property):
        value = value.fget
    code = getattr(value, "__code__", None)
    if not isinstance(code, CodeType) or depth > 3:
        return
    yield value
    wrapped = getattr(value, "__wrapped__", None)
    if wrapped is not None:
        yield from _functions(wrapped, depth + 1)
    for cell in value.__closure__ or ():
        try:
            inner = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        yield from _functions(inner, depth + 1)


def _codes_of(kind: type) -> set[CodeType]:
    """Code objects that run with an instance of ``kind`` as ``self`` (its methods, wrapped ones)."""
    codes: set[CodeType] = set()
    for klass in kind.__mro__:
        if klass in (object, IterDataPipe) or klass.__module__ == "typing":
            continue
        for value in vars(klass).values():
            codes.update(fn.__code__ for fn in _functions(value))
    return codes


class StageSampler:
    """Samples one thread's stack and adds up its CPU per stage of ``datapipe``.

    Args:
        datapipe: The graph the thread runs (labels: :func:`~.names.stage_labels`).
        interval: Seconds between two looks.
        inside: A code object that marks the loader on the stack (the main process, where
            the same thread also trains): a stack without it is not the loader's and is not
            counted. ``None``: every stack counts (a worker).
        budget: The sampler's own CPU is kept under this share of the sampled thread's CPU
            (:func:`next_wait`); ``float("inf")``: no budget, a look every ``interval``.
            Default: :data:`BUDGET`.
        until_stopped: The thread also runs code outside Python between items (a Ray task's
            thread, in Ray's own code while it sends an item): a look that finds no Python frame
            counts for the loader, and only :meth:`stop` ends the sampling. Default: ``False``
            (no Python frame: the thread ended, and the sampling ends with it).

    Attributes:
        cpu: CPU seconds per stage label.
        ticks: Looks that found the loader on the stack.
        looks: Looks taken.
        waits: Looks taken, by the wait before them (seconds -> looks): the waits
            :func:`next_wait` chose, at most ``log2(MAX_WAIT / interval) + 2`` of them.
        own_cpu: CPU seconds of the sampling thread itself (what sampling costs).
        target_cpu: CPU seconds of the sampled thread since the first look.
    """

    def __init__(
        self,
        datapipe: IterDataPipe[Any],
        interval: float,
        *,
        inside: CodeType | None = None,
        budget: float = BUDGET,
        until_stopped: bool = False,
    ) -> None:
        if interval <= 0:
            raise ValueError(f"interval should be a positive number of seconds, got {interval!r}")
        if not budget > 0:  # NaN too
            raise ValueError(f"budget should be a positive share, got {budget!r}")
        self.interval = interval
        self.budget = budget
        self._inside = inside
        self._until_stopped = until_stopped
        labels = stage_labels(datapipe)
        self._stages = {id(dp): dp for dp in stages_of(datapipe)}  # held: labels are by id
        self._labels = labels
        # code -> its stage's label, or None when several stages run it (then `self` decides)
        self._codes: dict[CodeType, str | None] = {}
        for dp in self._stages.values():
            label = labels[id(dp)]
            for code in _codes_of(type(dp)):
                if self._codes.get(code, label) != label:
                    self._codes[code] = None
                else:
                    self._codes[code] = label
        self.cpu: dict[str, float] = {}  # label -> CPU seconds
        self.ticks = 0  # looks that found the loader on the stack
        self.own_cpu = 0.0  # CPU seconds of the sampling thread itself: what sampling costs
        self.target_cpu = 0.0  # CPU seconds of the sampled thread since the first look
        self.looks = 0  # looks taken, whether or not they found the loader on the stack
        self.waits: dict[float, int] = {}  # wait (s) -> looks taken after it
        self._thread_id = 0
        self._clock: Callable[[], float] = time.process_time
        self._last = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self, thread_id: int | None = None) -> None:
        """Start sampling ``thread_id`` (default: the calling thread) in a daemon thread."""
        if self._thread is not None:
            return
        self._thread_id = threading.get_ident() if thread_id is None else thread_id
        self._clock = thread_cpu_clock(self._thread_id)
        self._last = self._clock()
        self._stop.clear()
        self._thread = threading.Thread(
            target=self._loop, name="shardpipes-stage-sampler", daemon=True
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop the sampling thread (the figures stay)."""
        thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def _loop(self) -> None:
        wait = self.interval
        start = time.thread_time()  # the thread's start-up is not a look's cost
        while not self._stop.wait(wait):
            frame = sys._current_frames().get(self._thread_id)
            if frame is None and not self._until_stopped:  # the thread ended
                return
            self.tick(frame)
            del frame
            self.waits[wait] = self.waits.get(wait, 0) + 1
            self.looks += 1
            self.own_cpu = time.thread_time() - start  # this thread's, wake-ups included
            wait = next_wait(
                wait, self.own_cpu, self.target_cpu, interval=self.interval, budget=self.budget
            )

    def tick(self, frame: FrameType | None) -> None:
        """Give the CPU used since the last look to the stage ``frame`` (innermost) is in."""
        now = self._clock()
        spent, self._last = now - self._last, now
        self.target_cpu += spent
        label = self.where(frame)
        if label is not None:
            self.ticks += 1
            self.cpu[label] = self.cpu.get(label, 0.0) + spent

    def where(self, frame: FrameType | None) -> str | None:
        """The label of the innermost stage on the stack, :data:`LOADER`, or ``None`` (not the loader's)."""
        codes, inside = self._codes, self._inside
        found: str | None = None
        while frame is not None:
            code = frame.f_code
            if found is None and code in codes:
                label = codes[code]
                if label is None:  # a code several stages share: ask the frame whose it is
                    owner = (
                        frame.f_locals.get("self") if code.co_varnames[:1] == ("self",) else None
                    )
                    mine = owner is not None and self._stages.get(id(owner)) is owner
                    label = self._labels[id(owner)] if mine else None
                if label is not None:
                    found = label
                    if inside is None:
                        return found
            if inside is not None and code is inside:
                return found if found is not None else LOADER
            frame = frame.f_back
        return LOADER if inside is None else None
