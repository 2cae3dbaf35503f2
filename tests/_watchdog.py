"""A hang never outlives its CI step: it ends the run, with the stack of every thread.

pytest-timeout (pyproject: ``timeout``, ``timeout_func_only``, its ``signal`` method) fails a test
whose body runs past its limit, and the run goes on. It cannot stop every hang:

- it does not time fixtures (``timeout_func_only``), nor what runs after the last test (such as
  the ``atexit`` join of a hung child process by ``multiprocessing``);
- its SIGALRM handler is Python code: it runs in the main thread between two bytecodes, so a main
  thread that waits in C code which retries on EINTR (a C++ condition variable, a mutex, a gloo
  collective) or that holds the GIL is never interrupted.

This plugin (loaded by tests/conftest.py, and by tests/conformance/run.sh as ``-p _watchdog``)
starts a watchdog process beside pytest and gives it a deadline: for the collection and the end
of the session ``watchdog_at_exit`` seconds, for each test (setup, body, teardown)
``watchdog_grace`` seconds more than pytest-timeout's limit for it. At a deadline the watchdog
process, which needs nothing from pytest's process (not its GIL), sends ``SIGUSR2`` to pytest and
to every process below it: pytest registered faulthandler on that signal before it forked
anything, so pytest and each of its forked workers write the stack of each of their threads to
the real stderr, from a signal handler, however stuck. Then it kills them all (``SIGKILL``) and
the step fails (exit status 137). Processes started with ``spawn`` or ``exec`` (Ray's, a
``torchrun``'s) are ended by the signal without a stack. The watchdog ends with pytest.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import select
import signal
import sys
import time
from collections.abc import Generator

import pytest

GRACE = 60.0  # seconds after pytest-timeout's limit for a test (ini: watchdog_grace)
AT_EXIT = 300.0  # seconds for the collection, and from the last test to the exit (watchdog_at_exit)
NO_LIMIT = 1800.0  # a test without a pytest-timeout limit
DUMP = signal.SIGUSR2
BAR = "+" * 30


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addini(
        "watchdog_grace",
        "seconds after a test's pytest-timeout limit until the watchdog ends the run",
        default=str(GRACE),
    )
    parser.addini(
        "watchdog_at_exit",
        "seconds the watchdog gives the collection, and the session's end after the last test",
        default=str(AT_EXIT),
    )


def _limit(item: pytest.Item) -> float:
    """pytest-timeout's limit for ``item`` (its marker, else ``--timeout``, else the ini value)."""
    marker = item.get_closest_marker("timeout")
    value = None
    if marker is not None:
        value = marker.args[0] if marker.args else marker.kwargs.get("timeout")
    if value is None:
        value = item.config.getoption("timeout", None)
    if value is None:
        value = item.config.getini("timeout") or None
    try:
        seconds = float(value) if value is not None else 0.0
    except (TypeError, ValueError):
        seconds = 0.0
    return seconds if seconds > 0 else NO_LIMIT


class _Watchdog:
    """pytest's side: the watchdog process and the pipe its deadlines go through."""

    def __init__(self, grace: float, at_exit: float) -> None:
        self.grace = grace
        self.at_exit = at_exit
        # The real stderr (pytest's capture is suspended while plugins are configured): the
        # stacks must reach the CI log whatever the capture does.
        err = os.dup(sys.stderr.fileno())
        faulthandler.register(DUMP, file=err, all_threads=True, chain=False)
        # posix_spawn, not subprocess: no Popen object left to warn at exit that it still runs
        read, self.pipe = os.pipe()  # both close-on-exec: the watchdog gets ``read`` as stdin
        self.pid = os.posix_spawn(
            sys.executable,
            [sys.executable, __file__, str(os.getpid())],
            os.environ,
            file_actions=[
                (os.POSIX_SPAWN_DUP2, read, 0),
                (os.POSIX_SPAWN_OPEN, 1, os.devnull, os.O_WRONLY, 0),
                (os.POSIX_SPAWN_DUP2, err, 2),
            ],
        )
        os.close(read)

    def arm(self, seconds: float, what: str) -> None:
        self._send(f"arm {seconds} {what}")

    def disarm(self) -> None:
        self._send("disarm")

    def _send(self, line: str) -> None:
        with contextlib.suppress(OSError):  # the watchdog is gone: nothing more to watch
            os.write(self.pipe, (line.replace("\n", " ") + "\n").encode())


_watchdog: list[_Watchdog] = []


def pytest_configure(config: pytest.Config) -> None:
    if _watchdog or not hasattr(signal, "SIGUSR2") or not os.path.isdir("/proc"):
        return
    grace = float(config.getini("watchdog_grace"))
    _watchdog.append(_Watchdog(grace, float(config.getini("watchdog_at_exit"))))


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_collection(session: pytest.Session) -> Generator[None, object, object]:
    if not _watchdog:
        return (yield)
    _watchdog[0].arm(_watchdog[0].at_exit, "collecting the tests")
    try:
        return (yield)
    finally:
        _watchdog[0].disarm()


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item) -> Generator[None, object, object]:
    if not _watchdog:
        return (yield)
    w = _watchdog[0]
    w.arm(_limit(item) + w.grace, f"test {item.nodeid} (its setup, body or teardown)")
    try:
        return (yield)
    finally:
        w.disarm()


@pytest.hookimpl(trylast=True)
def pytest_unconfigure(config: pytest.Config) -> None:
    # After the last test: pytest's own end and the interpreter's exit (atexit handlers). The
    # watchdog process ends when pytest's process does.
    if _watchdog:
        _watchdog[0].arm(_watchdog[0].at_exit, "the end of the test session")


# The watchdog process: ``python _watchdog.py PID``, deadlines on stdin, its stderr pytest's.


def _descendants(root: int) -> list[int]:
    """Every process below ``root`` (from /proc), parents before their children."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name is in parentheses and may hold anything: the fields follow the last ")"
        ppid = int(stat[stat.rindex(b")") + 2 :].split()[1])
        children.setdefault(ppid, []).append(int(name))
    found, todo = [], [root]
    while todo:
        for child in children.get(todo.pop(0), []):
            found.append(child)
            todo.append(child)
    return found


def _signal(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):  # it may have ended meanwhile
            os.kill(pid, sig)


def _say(text: str) -> None:
    os.write(2, text.encode())


def _fire(pytest_pid: int, what: str, seconds: float) -> None:
    below = [p for p in _descendants(pytest_pid) if p != os.getpid()]
    _say(
        f"\n{BAR} watchdog {BAR}\n{what}: still running {seconds:.0f} s after it started.\n"
        f"The stack of every thread of pytest's process ({pytest_pid}):\n"
    )
    _signal([pytest_pid], DUMP)
    time.sleep(1)
    if below:
        _say(f"\nThe processes below it {below}: each forked one writes its stacks.\n")
        _signal(below, DUMP)
        time.sleep(2)
    _signal(below, signal.SIGKILL)
    _say(f"\n{BAR} watchdog: the run ends here (pytest and every process below it killed) {BAR}\n")
    _signal([pytest_pid], signal.SIGKILL)


def _watch(pytest_pid: int) -> None:
    deadline: float | None = None
    what, seconds, pending = "", 0.0, b""
    while os.getppid() == pytest_pid:  # pytest is gone: so is the watchdog
        wait = 1.0 if deadline is None else min(1.0, max(deadline - time.monotonic(), 0.0))
        if select.select([0], [], [], wait)[0]:
            chunk = os.read(0, 65536)
            if not chunk:
                return
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                word, _, rest = line.decode(errors="replace").partition(" ")
                if word == "arm":
                    text, _, what = rest.partition(" ")
                    seconds = float(text)
                    deadline = time.monotonic() + seconds
                elif word == "disarm":
                    deadline = None
        if deadline is not None and time.monotonic() >= deadline:
            _fire(pytest_pid, what, seconds)
            return


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C for pytest is not for its watchdog
    _watch(int(sys.argv[1]))
