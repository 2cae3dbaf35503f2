"""The watchdog (tests/_watchdog.py) ends a run that hangs where pytest-timeout cannot reach.

A child pytest runs one test that hangs for good: its main thread waits in C holding the GIL (no
signal handler of Python's can run there, so pytest-timeout's cannot) on a forked worker that is
itself stuck in a lock acquire with no timeout. The watchdog must end that run within seconds,
with the stacks of both processes on stderr and no process left behind.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

HANGS = textwrap.dedent(
    """
    import ctypes
    import multiprocessing as mp
    import os
    import threading


    def stuck_in_the_worker(path):
        with open(path, "w") as f:
            f.write(str(os.getpid()))
        lock = threading.Lock()
        lock.acquire()
        lock.acquire()  # stuck_in_the_worker


    def test_hangs(tmp_path):
        path = os.path.join(os.environ["WATCHDOG_TEST_DIR"], "worker.pid")
        mp.get_context("fork").Process(target=stuck_in_the_worker, args=(path,)).start()
        mutex = ctypes.create_string_buffer(64)  # a pthread mutex, statically initialized
        lib = ctypes.PyDLL(None)  # calls into C holding the GIL
        lib.pthread_mutex_lock(mutex)
        lib.pthread_mutex_lock(mutex)  # stuck_in_the_main_thread
    """
)


def _line(marker: str) -> int:
    return next(i for i, line in enumerate(HANGS.splitlines(), 1) if line.endswith(marker))


def _ended(pid: int) -> bool:
    """Whether ``pid`` no longer runs (gone, or a zombie nobody reaped yet)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return True
    return stat[stat.rindex(b")") + 2 :].split()[0] in (b"Z", b"X")


def test_a_hang_in_c_ends_the_run_with_every_stack(tmp_path: Path) -> None:
    (tmp_path / "test_hangs.py").write_text(HANGS)
    here = os.path.dirname(os.path.abspath(__file__))
    env = {
        **os.environ,
        "WATCHDOG_TEST_DIR": os.fspath(tmp_path),
        "PYTHONPATH": os.pathsep.join([here, os.environ.get("PYTHONPATH", "")]),
    }
    started = time.monotonic()
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-p", "_watchdog", "-p", "no:cacheprovider", "-q"]
        + ["--timeout=1", "-o", "watchdog_grace=1", "test_hangs.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=240,  # without the watchdog the run would never end
    )
    took = time.monotonic() - started
    err = run.stderr
    assert run.returncode == -9, (run.returncode, run.stdout[-2000:], err[-4000:])
    assert "test_hangs.py::test_hangs (its setup, body or teardown): still running 2 s" in err
    # The stacks: the main thread of pytest where it waits, and the forked worker where it waits.
    assert f'test_hangs.py", line {_line("# stuck_in_the_main_thread")} in test_hangs' in err, err
    assert f'test_hangs.py", line {_line("# stuck_in_the_worker")} in stuck_in_the_worker' in err
    assert "the run ends here" in err
    worker = int((tmp_path / "worker.pid").read_text())
    deadline = time.monotonic() + 10
    while not _ended(worker) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _ended(worker), f"the hung worker {worker} outlived the run"
    assert took < 200
