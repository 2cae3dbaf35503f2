"""Shared memory never outlives its job: after any ending, no block of the loader is left.

Each test runs the loader in a child process (the README graph, ``num_workers=2``, 100 KB
samples), ends it one way or another, waits until every process of the job is gone, and counts
the job's blocks by name (``_shm_blocks.py``): in ``/dev/shm``, and mapped or held open by any
process. Blocks are named with a prefix of this run's own (``SHARDPIPES_SHM_PREFIX``).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from _shm_blocks import PREFIX_ENV, blocks_left, named_blocks, new_prefix, processes_holding
from shardpipes.dataloader2.workers.blocks import DIR_ENV, make_block, prefix, remove_stale
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.synthetic import write_synthetic

_CHILD = r"""
import hashlib, json, os, sys, time
from shardpipes.datapipes.iter import IterableWrapper
from shardpipes.dataloader2 import (
    DataLoader2, DistributedReadingService, MultiProcessingReadingService,
    SequentialReadingService,
)



def key_and_bytes(sample):
    return sample["__key__"], bytes(sample[".bin"])


how, paths, workers, batch = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rs = MultiProcessingReadingService(num_workers=workers)
if how == "rank":
    import datetime
    import torch.distributed as dist
    dist.init_process_group(  # a file rendezvous: no port to pick, none another run can take
        "gloo",
        init_method=os.environ["STORE"],
        rank=int(os.environ["RANK"]),
        world_size=int(os.environ["WORLD_SIZE"]),
        timeout=datetime.timedelta(seconds=20),
    )
    rs = SequentialReadingService(DistributedReadingService(), rs)
dp = (IterableWrapper(paths).shuffle().sharding_filter().open_files_by_fsspec(mode="rb")
      .load_from_tar().webdataset().decode())
if how == "bytes":  # every member's bytes read in the worker: they cross through the blocks
    dp = dp.map(key_and_bytes)
dp = dp.shuffle(buffer_size=50).batch(batch)
dl = DataLoader2(dp, reading_service=rs)
if how == "bytes":
    got = sorted((k, len(v), hashlib.sha1(v).hexdigest()) for b in dl for k, v in b)
    print(json.dumps(got), flush=True)
    sys.exit(0)
for i, _ in enumerate(dl):
    if i == 5:
        print("READY", flush=True)
        if how in ("raise", "exit"):
            sys.stdin.readline()  # the test has seen the blocks in use
        if how == "raise":
            raise RuntimeError("the training loop failed")
        if how == "exit":
            sys.exit(0)  # without dl.shutdown()
        if how == "rank" and os.environ["RANK"] == "0":
            continue  # to its next collective, with a rank that was killed
        time.sleep(120)  # until killed
"""


def _state(pid: int) -> str | None:
    """A process's state letter, or ``None`` when it is gone (a zombie holds nothing)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except FileNotFoundError:
        return None
    state = stat[stat.rindex(b")") + 2 :].split()[0].decode()
    return None if state in "ZX" else state


def _descendants(pid: int) -> list[int]:
    found, todo = [], [pid]
    while todo:
        p = todo.pop()
        try:
            tasks = os.listdir(f"/proc/{p}/task")
        except FileNotFoundError:
            continue
        for t in tasks:
            try:
                with open(f"/proc/{p}/task/{t}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                continue
            found += kids
            todo += kids
    return found


def _wait_gone(pids: list[int], polls: int = 450) -> None:
    """Wait until every one of ``pids`` has ended (torch's workers notice a dead parent in 5 s).

    Looks ``polls`` times, 0.2 s apart (about 90 s), and fails naming those still running.
    """
    for _ in range(polls):
        if not any(_state(p) for p in pids):
            return
        time.sleep(0.2)
    pytest.fail(f"still running after {polls} looks: {[p for p in pids if _state(p)]}")


@pytest.fixture
def job(tmp_path, monkeypatch):
    """Start the child; yields ``start(how, ...) -> Popen`` and this run's block prefix."""
    own = new_prefix()
    paths = write_synthetic(tmp_path, shards=8, samples=40, payload_bytes=100_000)
    env = {**os.environ, PREFIX_ENV: own, "PYTHONPATH": os.pathsep.join(sys.path)}
    script = tmp_path / "child.py"
    script.write_text(_CHILD)
    started: list[subprocess.Popen[str]] = []

    def start(
        how: str, *, extra_env: dict[str, str] | None = None, files=paths, workers=2, batch=16
    ):
        proc = subprocess.Popen(
            [sys.executable, str(script), how, json.dumps(files), str(workers), str(batch)],
            env={**env, **(extra_env or {})},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        started.append(proc)
        return proc

    start.prefix = own  # type: ignore[attr-defined]
    start.tmp = tmp_path  # type: ignore[attr-defined]
    yield start
    for proc in started:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


def _ready(proc: subprocess.Popen[str], own: str) -> list[int]:
    """Wait for 5 batches; return the job's processes, checked to hold this run's blocks."""
    line = proc.stdout.readline()  # type: ignore[union-attr]
    assert line.strip() == "READY", line + proc.stderr.read()  # type: ignore[union-attr]
    pids = [proc.pid, *_descendants(proc.pid)]
    holding = processes_holding(own)
    # the main process and both workers map blocks now: the counts below can fail
    assert proc.pid in holding and len(set(holding) & set(pids)) >= 3, holding
    return pids


def _nothing_left(own: str, pids: list[int]) -> None:
    _wait_gone(pids)
    assert not blocks_left(own)
    # nor any other segment the job made (torch's own are named after their pid)
    assert not [n for n in os.listdir("/dev/shm") for p in pids if f"_{p}_" in n]


def test_main_process_killed(job):
    proc = job("sleep")
    pids = _ready(proc, job.prefix)
    proc.send_signal(signal.SIGKILL)
    _nothing_left(job.prefix, pids)


def test_a_worker_killed(job):
    proc = job("sleep")
    pids = _ready(proc, job.prefix)
    os.kill(pids[-1], signal.SIGKILL)  # the main process sleeps on, holding its maps
    _wait_gone([pids[-1]])
    proc.send_signal(signal.SIGTERM)  # then the job ends as a scheduler ends it
    _nothing_left(job.prefix, pids)


@pytest.mark.parametrize("how", ["raise", "exit"])
def test_an_exception_or_an_exit_without_shutdown(job, how):
    proc = job(how)
    pids = _ready(proc, job.prefix)
    _, err = proc.communicate("go\n", timeout=120)
    assert proc.returncode == (1 if how == "raise" else 0), err
    assert "resource_tracker" not in err and "leaked" not in err, err
    if how == "raise":
        assert "the training loop failed" in err
    _nothing_left(job.prefix, pids)


def test_one_rank_of_two_killed(job, tmp_path):
    store = f"file://{tmp_path / 'store'}"
    ranks = [
        job("rank", extra_env={"STORE": store, "RANK": str(r), "WORLD_SIZE": "2"}) for r in range(2)
    ]
    pids = [p for proc in ranks for p in _ready(proc, job.prefix)]
    ranks[1].send_signal(signal.SIGKILL)
    # rank 0 fails at its next collective (or, at worst, its gloo time-out of 20 s)
    ranks[0].communicate(timeout=120)
    assert ranks[0].returncode != 0
    _nothing_left(job.prefix, pids)


def _unshare_works() -> bool:
    if not shutil.which("unshare"):
        return False
    probe = "mount -t tmpfs -o size=1m tmpfs /dev/shm"
    return subprocess.run(["unshare", "-m", "sh", "-c", probe], capture_output=True).returncode == 0


@pytest.mark.skipif(not _unshare_works(), reason="needs root and unshare -m to mount a small tmpfs")
@pytest.mark.parametrize("where", ["anonymous", "in /dev/shm"])
def test_a_64_mb_dev_shm_is_enough_for_4_workers_and_2_mb_samples(job, where):
    """Docker's default /dev/shm. Anonymous blocks (the default) do not live there at all;
    blocks made in it (SHARDPIPES_SHM_DIR) find it full and those batches are pickled."""
    paths = write_synthetic(job.tmp / "big", shards=4, samples=6, payload_bytes=2 << 20)
    members = IterableWrapper(paths).open_files_by_fsspec(mode="rb").load_from_tar().webdataset()
    expected = sorted(
        [s["__key__"], len(s[".bin"]), hashlib.sha1(bytes(s[".bin"])).hexdigest()] for s in members
    )
    script = job.tmp / "child.py"
    env = {**os.environ, PREFIX_ENV: job.prefix, "PYTHONPATH": os.pathsep.join(sys.path)}
    if where != "anonymous":
        env[DIR_ENV] = "/dev/shm"
    command = (
        "mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "
        f"{sys.executable} {script} bytes '{json.dumps(paths)}' 4 4"
    )
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", command], env=env, capture_output=True, text=True, timeout=300
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == expected and len(expected) == 24
    fallback = "no shared memory for large payloads" in out.stderr
    assert fallback == (where != "anonymous"), out.stderr


def test_the_janitor_removes_names_whose_maker_is_gone(tmp_path, monkeypatch):
    monkeypatch.setenv(PREFIX_ENV, new_prefix())
    monkeypatch.setenv(DIR_ENV, str(tmp_path))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    live_fd, live = make_block()[:2]  # its name is gone at once; make one that stays:
    os.close(live_fd)
    mine = live
    (tmp_path / mine).write_bytes(b"")  # this process, alive: kept
    b36 = "0123456789abcdefghijklmnopqrstuvwxyz"

    def base36(n: int) -> str:
        return b36[n] if n < 36 else base36(n // 36) + b36[n % 36]

    stale = f"{prefix()}{base36(dead.pid)}_{base36(12345)}_0"  # its maker is gone
    reused = f"{prefix()}{base36(os.getpid())}_{base36(1)}_0"  # this pid, another start time
    other = f"{prefix()}notours"  # not the form of a block: left alone
    for name in (stale, reused, other):
        (tmp_path / name).write_bytes(b"")
    assert sorted(remove_stale()) == sorted([stale, reused])
    assert named_blocks(prefix(), str(tmp_path)) == sorted([mine, other])
