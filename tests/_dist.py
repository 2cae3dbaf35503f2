"""Run a function on several real torch.distributed (gloo) ranks on this machine.

Rendezvous is a FileStore in a temporary directory (no ports to race for); gloo talks over the
loopback interface only. Ranks that hang past the timeout, die by a signal, exit non-zero or
raise are reported separately, each with its own output.
"""

from __future__ import annotations

import os
import pickle
import tempfile
import traceback
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
import torch.multiprocessing as mp


class RanksFailed(AssertionError):
    pass


def _entry(
    fn: Callable[..., Any], rank: int, world: int, store: str, out: str, args: tuple
) -> None:
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    result: tuple[str, Any]
    try:
        dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=world)
        try:
            result = ("ok", fn(rank, world, *args))
        finally:
            dist.destroy_process_group()
    except BaseException as exc:  # reported to the parent with the traceback
        result = ("error", f"{type(exc).__name__}: {exc}\n{traceback.format_exc()}")
    with open(f"{out}.{rank}", "wb") as f:
        pickle.dump(result, f)


def run_ranks(
    fn: Callable[..., Any],
    world: int,
    *args: Any,
    timeout: float = 240,
    start_method: str = "spawn",
    expect_errors: bool = False,
    expect_killed: frozenset[int] = frozenset(),
) -> list[Any]:
    """Run ``fn(rank, world, *args)`` on ``world`` ranks; return the per-rank results.

    With ``expect_errors=True`` a rank's error is returned as ``("error", text)`` instead of
    failing; hung ranks always fail, and signalled ranks fail unless listed in ``expect_killed``.
    """
    ctx = mp.get_context(start_method)
    with tempfile.TemporaryDirectory(prefix="shardpipes-dist-") as tmp:
        store, out = os.path.join(tmp, "store"), os.path.join(tmp, "result")
        procs = [
            ctx.Process(target=_entry, args=(fn, r, world, store, out, args)) for r in range(world)
        ]
        for p in procs:
            p.start()
        hung, signalled, nonzero = [], [], []
        for rank, p in enumerate(procs):
            p.join(timeout)
            if p.is_alive():
                hung.append(rank)
        for p in procs:
            if p.is_alive():
                p.kill()
                p.join(10)
        results: list[Any] = []
        errors = []
        for rank, p in enumerate(procs):
            if rank in hung:
                results.append(None)
                continue
            if p.exitcode is not None and p.exitcode < 0:
                if rank not in expect_killed:
                    signalled.append((rank, -p.exitcode))
                results.append(("killed", -p.exitcode))
                continue
            elif p.exitcode:
                nonzero.append((rank, p.exitcode))
            try:
                with open(f"{out}.{rank}", "rb") as f:
                    status, value = pickle.load(f)
            except FileNotFoundError:
                results.append(None)
                continue
            if status == "error" and not expect_errors:
                errors.append(f"rank {rank} raised {value}")
            results.append(value if status == "ok" else ("error", value))
        problems = []
        if hung:
            problems.append(f"ranks {hung} hung past {timeout} s")
        if signalled:
            problems.append(f"ranks died by signal: {signalled}")
        if nonzero:
            problems.append(f"ranks exited non-zero: {nonzero}")
        problems.extend(errors)
        if problems:
            raise RanksFailed("\n".join(problems))
        return results
